"""AdamW with linear warmup and a cosine (or constant) schedule."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from ..config import TrainConfig


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


def lr_at(step: int, cfg: TrainConfig) -> float:
    """:func:`scheduled_lr` with a run's ``train`` settings."""
    return scheduled_lr(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio, cfg.schedule)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay only on matrices (not norms, biases or single tokens)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
