"""AdamW (or ELF's Muon, :mod:`elfreg.train.muon`) with linear warmup and a cosine (or constant)
schedule."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from ..config import TrainConfig
from .muon import ElfMuon


def scheduled_lr(step: int, lr: float, warmup_steps: int, total_steps: int, floor_ratio: float,
                 kind: Literal["cosine", "constant"] = "cosine") -> float:
    """Learning rate of optimiser step ``step`` (0-based).

    Linear warmup ``lr·(step + 1)/warmup_steps`` over the first ``warmup_steps`` steps, so the
    first step already moves; then ``lr`` (``constant``) or a half cosine from ``lr`` at the end
    of warmup down to ``floor_ratio·lr`` at ``total_steps``, held there after.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if kind == "constant":
        return lr
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    floor = lr * floor_ratio
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def cosine_steps(cfg: TrainConfig) -> int:
    """The length of a run's cosine schedule: ``train.decay_steps``, else the run's steps."""
    return cfg.steps if cfg.decay_steps is None else cfg.decay_steps


def lr_at(step: int, cfg: TrainConfig) -> float:
    """:func:`scheduled_lr` with a run's ``train`` settings."""
    return scheduled_lr(step, cfg.lr, cfg.warmup_steps, cosine_steps(cfg), cfg.min_lr_ratio, cfg.schedule)


AdamWImpl = Literal["auto", "for-loop", "foreach", "fused"]
"""How AdamW's update runs: one parameter at a time (``for-loop``), as multi-tensor ops
(``foreach``), or as one fused kernel per device and dtype (``fused``; CPU and CUDA). All three
compute the same update up to float rounding. ``auto``: ``fused`` when every parameter is a plain
floating-point tensor on CPU or CUDA, else torch's default."""


def adamw_kwargs(params: list[torch.Tensor], impl: AdamWImpl = "auto") -> dict[str, bool]:
    """The ``foreach``/``fused`` arguments of ``torch.optim.AdamW`` for ``impl`` (see
    :data:`AdamWImpl`); ``auto`` falls back to torch's default for DTensors (FSDP2) and other
    devices."""
    if impl == "for-loop":
        return {"foreach": False}
    if impl == "foreach":
        return {"foreach": True}
    if impl == "fused":
        return {"fused": True}
    plain = all(type(p) in (torch.Tensor, nn.Parameter) and p.device.type in ("cpu", "cuda")
                and p.is_floating_point() for p in params)
    return {"fused": True} if plain and params else {}


def make_optimizer(model: nn.Module, cfg: TrainConfig, impl: AdamWImpl = "auto") -> torch.optim.Optimizer:
    """AdamW, weight decay only on matrices (not norms, biases or single tokens); or, with
    ``train.optimizer: muon``, ELF's Muon (:class:`~elfreg.train.muon.ElfMuon`): Muon on every
    matrix and Nesterov-Adam on the rest, one learning rate and schedule for both. ``impl`` picks
    how AdamW's update runs (:data:`AdamWImpl`; the fused kernel by default, which is faster on
    CPU and gives the same weights up to rounding)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "muon":
        return ElfMuon(params, lr=cfg.lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **adamw_kwargs(params, impl))
