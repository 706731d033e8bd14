"""Noising path, the clamped denominator c_t and the training-time distributions (spec §3)."""

from __future__ import annotations

import math

import torch


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
                        generator: torch.Generator) -> torch.Tensor:
    """sigmoid(N(mean, std)) samples (training t: mean −1.5, std 0.8; one t per sequence)."""
    dev = generator.device
    return torch.sigmoid(mean + std * torch.randn(shape, generator=generator, device=dev))


def sample_guidance_scale(n: int, w_min: float, w_max: float, generator: torch.Generator) -> torch.Tensor:
    """SC-CFG scales w ∈ [w_min, w_max] with 1+w log-uniform (ELF code convention)."""
    lo, hi = math.log1p(w_min), math.log1p(w_max)
    u = torch.rand(n, generator=generator, device=generator.device)
    return torch.expm1(lo + (hi - lo) * u)


def perturb_for_decoding(x: torch.Tensor, lam: torch.Tensor, scale: float, eps: torch.Tensor) -> torch.Tensor:
    """Decode-example input λ·x + (1−λ)·s·ε with a mixing weight λ per token (B, L)."""
    lam = lam[..., None]
    return lam * x + (1 - lam) * scale * eps
