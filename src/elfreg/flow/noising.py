"""Noising path, the clamped denominator c_t and the training-time distributions (ELF-REG §3, App. A).

Training draws come from a *source*: a ``torch.Generator`` (the whole batch from one stream, in
batch order) or :class:`RowDraws` (row i from its own generator, so a row's draws do not depend
on which other rows share its batch; the trainer seeds each row from (seed, micro-batch, global
position), which makes N ranks draw what one process draws).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


class RowDraws:
    """Random draws for a batch whose row i comes from ``generators[i]`` alone.

    ``randn(shape)`` / ``rand(shape)`` take the batch shape (rows first) and return what each
    row's generator draws for ``shape[1:]``, stacked; every row's generator sees the same
    sequence of calls, so a row's values are a function of its generator's seed only.
    """

    def __init__(self, generators: Sequence[torch.Generator]):
        self.generators = list(generators)
        self.device = self.generators[0].device if self.generators else torch.device("cpu")

    def _draw(self, fn, shape: tuple[int, ...]) -> torch.Tensor:
        if shape[0] != len(self.generators):
            raise ValueError(f"{shape[0]} rows asked of draws for {len(self.generators)} rows")
        return torch.stack([fn(shape[1:], generator=g, device=g.device) for g in self.generators])

    def randn(self, shape: tuple[int, ...]) -> torch.Tensor:
        return self._draw(torch.randn, tuple(shape))

    def rand(self, shape: tuple[int, ...]) -> torch.Tensor:
        return self._draw(torch.rand, tuple(shape))


def randn(shape: tuple[int, ...], source: torch.Generator | RowDraws) -> torch.Tensor:
    """Standard normal draws of ``shape`` from ``source`` (on the source's device)."""
    if isinstance(source, RowDraws):
        return source.randn(shape)
    return torch.randn(shape, generator=source, device=source.device)


def rand(shape: tuple[int, ...], source: torch.Generator | RowDraws) -> torch.Tensor:
    """Uniform [0, 1) draws of ``shape`` from ``source`` (on the source's device)."""
    if isinstance(source, RowDraws):
        return source.rand(shape)
    return torch.rand(shape, generator=source, device=source.device)


def add_noise(x: torch.Tensor, t: torch.Tensor, sigma: float, eps: torch.Tensor) -> torch.Tensor:
    """Eq. 1: z_t = t·x + (1−t)·σ·ε, with t = 0 noise and t = 1 clean. ``t`` is per row (B,)."""
    tt = t.reshape(-1, *([1] * (x.dim() - 1)))
    return tt * x + (1 - tt) * sigma * eps


def c_t(t: torch.Tensor, c_min: float = 0.05) -> torch.Tensor:
    """c_t = max(1 − t, c_min): the clamped denominator of the velocity."""
    return (1 - t).clamp(min=c_min)


def velocity(x_hat: torch.Tensor, z: torch.Tensor, t: torch.Tensor, c_min: float = 0.05) -> torch.Tensor:
    """v = (x̂ − z_t)/c_t, the velocity implied by a clean prediction."""
    c = c_t(t, c_min).reshape(-1, *([1] * (z.dim() - 1)))
    return (x_hat - z) / c


def sample_logit_normal(shape: tuple[int, ...], mean: float, std: float,
                        generator: torch.Generator | RowDraws) -> torch.Tensor:
    """sigmoid(N(mean, std)) samples (training t: mean −1.5, std 0.8; one t per sequence)."""
    return torch.sigmoid(mean + std * randn(shape, generator))


def sample_guidance_scale(n: int, w_min: float, w_max: float,
                          generator: torch.Generator | RowDraws) -> torch.Tensor:
    """SC-CFG scales w ∈ [w_min, w_max] with 1+w log-uniform (ELF code convention)."""
    lo, hi = math.log1p(w_min), math.log1p(w_max)
    return torch.expm1(lo + (hi - lo) * rand((n,), generator))


def perturb_for_decoding(x: torch.Tensor, lam: torch.Tensor, scale: float, eps: torch.Tensor) -> torch.Tensor:
    """Decode-example input λ·x + (1−λ)·s·ε with a mixing weight λ per token (B, L)."""
    lam = lam[..., None]
    return lam * x + (1 - lam) * scale * eps
