"""One sampler step: the guided prediction, the update rules and the noise they draw (ELF-REG §3, App. C).

The sampled state is the joint text + REG state; every rule here applies to each component with
the same time and is called once for the text part (B, L, d) and once for the REG part (B, d_r).
Times are per row (B,).

Noise is per sample: every sample draws from its own generator, so results do not depend on the
batch a sample is run in (sample j of a prompt uses seed ``seed + j``). Draw order of one sample
(part of the reproducibility contract): the initial text noise for the whole canvas (L, d) — only
answer positions are used — then the initial REG noise (d_r), then, for the re-noising rule only,
one (L, d) text draw (n × d once canvas trimming has cut the canvas to n) and one (d_r) REG draw
per re-noised step. The generators live on the network's device; the same seed gives the same
noise on the same device type.
"""

from __future__ import annotations

import torch

from ..flow.noising import velocity
from .network import CountingNetwork


class NoiseSource:
    """Standard normal draws from one generator per sample."""

    def __init__(self, seeds: list[int], device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.generators = [torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds]

    def normal(self, rows: torch.Tensor | list[int], shape: tuple[int, ...]) -> torch.Tensor:
        """(len(rows), *shape) draws; row k comes from the generator of sample ``rows[k]``."""
        rows = rows.tolist() if isinstance(rows, torch.Tensor) else rows
        return torch.stack([torch.randn(shape, generator=self.generators[r], device=self.device) for r in rows])


def _per_row(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def euler_update(y: torch.Tensor, d: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor,
                 c_min: float = 0.05) -> torch.Tensor:
    """Eq. 12: v_j = (d_j − y_j)/max(1 − t_j, c_min); y_{j+1} = y_j + (t_{j+1} − t_j)·v_j."""
    return y + _per_row(t_next - t, y) * velocity(d, y, t.to(y.dtype), c_min)


def renoise_input(d: torch.Tensor, t_next: torch.Tensor, eta: float, sigma: float,
                  xi: torch.Tensor) -> torch.Tensor:
    """Re-noising (§5.1): z_{i+1} = t_{i+1}·x̂_i + (1 − t_{i+1})·η·σ·ξ_i with fresh ξ_i."""
    tt = _per_row(t_next, d)
    return tt * d + (1 - tt) * (eta * sigma) * xi


def with_clean_prompt(z: torch.Tensor, prompt_states: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """Prompt positions always hold the clean encoder states."""
    return torch.where(prompt_mask[..., None], prompt_states, z)


def drop_prompt(z: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """The 'no prompt' input of prompt CFG: prompt positions set to zero states.

    Zero is the per-feature mean of the standardised encoder states (and what the zero-initialised
    head predicts), so it carries no prompt content, while the canvas layout (which positions are
    answer positions, their RoPE positions) stays the same. It is what training's prompt drop
    (``flow.prompt_drop``, ELF's label drop) shows the student; without it prompt CFG is an
    inference-only extrapolation.
    """
    return z.masked_fill(prompt_mask[..., None], 0.0)


def guide(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance on clean predictions: uncond + s·(cond − uncond).

    Guiding the clean prediction d is the same as guiding the velocity of Eq. 12, which is
    affine in d at fixed y and t.
    """
    return uncond + scale * (cond - uncond)


def predict(net: CountingNetwork, rows: torch.Tensor, y: torch.Tensor, q: torch.Tensor, t: torch.Tensor,
            w: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None, reg_q: torch.Tensor | None,
            prompt_cfg: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """d_j = D_θ(y_j, q_j, t_j) with SC-CFG scale w as a network input (one call per sample).

    With ``prompt_cfg`` ≠ 1 a second, prompt-dropped row is evaluated for each sample in the same
    forward (two calls per sample) and both the text and REG predictions are guided. The dropped
    row has its prompt removed from the state and from the self-conditioning input alike (which
    holds the clean prompt at prompt positions), as ELF's sampler does.
    Prompt positions of the result hold the clean prompt states of ``y``.
    """
    if prompt_cfg == 1.0:
        d, rd = net.denoise(y, q, t, w, prompt_mask, reg, reg_q, rows=rows)
    else:
        def two(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else torch.cat([x, x])

        d2, rd2 = net.denoise(torch.cat([y, drop_prompt(y, prompt_mask)]), torch.cat([q, drop_prompt(q, prompt_mask)]),
                              two(t), two(w), two(prompt_mask), two(reg), two(reg_q), rows=torch.cat([rows, rows]))
        b = y.shape[0]
        d = guide(d2[:b], d2[b:], prompt_cfg)
        rd = None if rd2 is None else guide(rd2[:b], rd2[b:], prompt_cfg)
    return with_clean_prompt(d, y, prompt_mask), rd
