"""One sampler step: the guided prediction, the update rules and the noise they draw (ELF-REG §3, App. C).

The sampled state is the joint text + REG state; every rule here applies to each component with
the same time and is called once for the text part (B, L, d) and once for the REG part (B, d_r).
Times are per row (B,).

Noise is per sample: every sample draws from its own generator, so results do not depend on the
batch a sample is run in (sample j of a prompt uses seed ``seed + j``). Draw order of one sample
(part of the reproducibility contract): the initial text noise for the whole canvas (L, d) — only
answer positions are used — then the initial REG noise (d_r), then, for the re-noising rule and
ELF's SDE step only, one (L, d) text draw (n × d once canvas trimming has cut the canvas to n)
and one (d_r) REG draw per re-noised or stepped-back step (the SDE step draws none at γ = 0).
The generators live on the network's device; the same seed gives the same noise on the same
device type.
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


def sde_back_step(y: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, gamma: float, sigma: float,
                  xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first half of ELF's SDE step (ELF's ``_sde_step``): back from t_j to t̃_j with fresh noise.

    α_j = clip(1 − γ·(t_{j+1} − t_j), 0, 1), t̃_j = α_j·t_j, ỹ_j = α_j·y_j + (1 − α_j)·σ·ξ_j.
    The network is then called at (ỹ_j, t̃_j) and Eq. 12 moves from t̃_j to t_{j+1} (the second
    half). α is constant in t for a given step size, so γ = 0 is the plain Euler step. Returns
    (ỹ_j, t̃_j); ``t`` and ``t_next`` are per row (B,).
    """
    alpha = (1 - gamma * (t_next - t)).clamp(0.0, 1.0)
    a = _per_row(alpha, y)
    return a * y + (1 - a) * sigma * xi, alpha * t


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


def guide(cond: torch.Tensor, uncond: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """Classifier-free guidance on clean predictions: uncond + s·(cond − uncond); ``scale`` is a
    number or one per row (B,).

    Guiding the clean prediction d is the same as guiding the velocity of Eq. 12, which is
    affine in d at fixed y and t.
    """
    if isinstance(scale, torch.Tensor):
        scale = _per_row(scale, cond)
    return uncond + scale * (cond - uncond)


def without_self_conditioning(q: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """The zero self-conditioning input: zeros at answer positions, the prompt kept (ELF's
    ``restore_cond(zeros, cond_seq)``)."""
    return torch.where(prompt_mask[..., None], q, torch.zeros_like(q))


def predict(net: CountingNetwork, rows: torch.Tensor, y: torch.Tensor, q: torch.Tensor, t: torch.Tensor,
            w: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None, reg_q: torch.Tensor | None,
            prompt_cfg: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """d_j = D_θ(y_j, q_j, t_j) with SC-CFG scale w as a network input (one call per sample).

    With ``prompt_cfg`` ≠ 1 a second, prompt-dropped row is evaluated for each sample in the same
    forward (two calls per sample) and both the text and REG predictions are guided. The dropped
    row has its prompt removed from the state and from the self-conditioning input alike (which
    holds the clean prompt at prompt positions), as ELF's sampler does.

    A network whose SC-CFG scale is not an input (``guides_self_conditioning``: a model without
    SC-CFG tokens) is guided as ELF's sampler guides it when w ≠ 1: each row once more with zero
    self-conditioning, d = d(0) + w·(d(q) − d(0)), one more call per row. The rows of one forward
    are in ELF's call order: per prompt branch (conditional, then dropped) the zero
    self-conditioning row, then the row with q.
    Prompt positions of the result hold the clean prompt states of ``y``.
    """
    branches = [(y, q)] if prompt_cfg == 1.0 else [(y, q), (drop_prompt(y, prompt_mask), drop_prompt(q, prompt_mask))]
    by_calls = getattr(net, "guides_self_conditioning", False) and bool((w != 1).any())
    zero_rq = None if reg_q is None else torch.zeros_like(reg_q)
    inputs = [part for z, sc in branches
              for part in ([(z, without_self_conditioning(sc, prompt_mask), zero_rq)] if by_calls else [])
              + [(z, sc, reg_q)]]
    k = len(inputs)

    def cat(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else torch.cat([x] * k)

    d_all, rd_all = net.denoise(torch.cat([z for z, _, _ in inputs]), torch.cat([sc for _, sc, _ in inputs]),
                                cat(t), cat(w), cat(prompt_mask), cat(reg),
                                None if reg_q is None else torch.cat([rq for _, _, rq in inputs]), rows=cat(rows))
    texts, regs = d_all.chunk(k), [None] * k if rd_all is None else rd_all.chunk(k)
    if by_calls:  # each branch: guide its pair of rows by w
        texts = [guide(texts[i + 1], texts[i], w) for i in range(0, k, 2)]
        regs = [None if regs[i] is None else guide(regs[i + 1], regs[i], w) for i in range(0, k, 2)]
    d, rd = texts[0], regs[0]
    if prompt_cfg != 1.0:
        d = guide(texts[0], texts[1], prompt_cfg)
        rd = None if rd is None else guide(regs[0], regs[1], prompt_cfg)
    return with_clean_prompt(d, y, prompt_mask), rd
