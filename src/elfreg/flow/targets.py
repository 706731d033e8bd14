"""The self-conditioning guidance target learned into the network (Eq. 7–9)."""

from __future__ import annotations

import torch

from .noising import c_t


def sc_cfg_target(
    x: torch.Tensor,
    z: torch.Tensor,
    t: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    v_sc: torch.Tensor,
    v_nosc: torch.Tensor,
    c_min: float = 0.05,
) -> torch.Tensor:
    """Eq. 7–8: v_target = sg[(x − z_t)/c_t + b·(1 − 1/w)·(v_sc − v_nosc)].

    ``t``, ``b`` (0/1) and ``w`` are per row; the result carries no gradient.
    """
    shape = (-1, *([1] * (x.dim() - 1)))
    guide = (b.float() * (1 - 1 / w.float())).reshape(shape)
    target = (x - z) / c_t(t, c_min).reshape(shape) + guide * (v_sc - v_nosc)
    return target.detach()


def clean_target(z: torch.Tensor, t: torch.Tensor, v_target: torch.Tensor, c_min: float = 0.05) -> torch.Tensor:
    """Eq. 9: x*_t = sg(z_t + c_t·v_target), the clean state that the velocity target implies."""
    return (z + c_t(t, c_min).reshape(-1, *([1] * (z.dim() - 1))) * v_target).detach()
