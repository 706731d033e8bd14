"""The loss terms as pure functions (ELF-REG §3, App. A). Each returns per-position (or per-row) values;
the averaging sets, which differ between terms, are applied in :mod:`elfreg.flow.objective`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .noising import c_t, velocity


def velocity_sq_error(x_hat: torch.Tensor, z: torch.Tensor, t: torch.Tensor, v_target: torch.Tensor,
                      c_min: float = 0.05) -> torch.Tensor:
    """‖v_θ − v_target‖² / d over the last axis, with v_θ = (x̂ − z)/c_t (no extra c_t⁻² weight)."""
    v = velocity(x_hat.float(), z.float(), t, c_min)
    return (v - v_target.float()).pow(2).sum(-1) / v.shape[-1]


def x_form_sq_error(x_hat: torch.Tensor, x_star: torch.Tensor, t: torch.Tensor, c_min: float = 0.05) -> torch.Tensor:
    """Eq. 9's clean-state form: c_t⁻²·‖x̂ − x*_t‖² / d. Equal to :func:`velocity_sq_error`."""
    c = c_t(t, c_min).reshape(-1, *([1] * (x_hat.dim() - 2)))
    return (x_hat.float() - x_star.float()).pow(2).sum(-1) / (c.pow(2) * x_hat.shape[-1])


def repa_cosine(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """ℓ_REPA,i = 1 − cos(p_φ(u_i^(ℓ)), h_i), per position."""
    return 1 - F.cosine_similarity(pred.float(), target.float(), dim=-1, eps=1e-6)


def token_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy of the decoder (computed in fp32)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens.reshape(-1),
                           reduction="none").reshape(tokens.shape)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (0 when the mask is empty, keeping the graph); ``count``
    replaces the mask's size as the divisor (the set's size over a global batch of many ranks)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / (mask.sum() if count is None else count).clamp(min=1)
