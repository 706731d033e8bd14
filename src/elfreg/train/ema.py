"""Exponential moving average of the student's weights (kept in fp32)."""

from __future__ import annotations

import torch
from torch import nn


class EMA:
    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().float().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                self.shadow[k].lerp_(v.float(), 1 - self.decay)
            else:
                self.shadow[k].copy_(v)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.shadow) ^ set(state)
        if missing:
            raise KeyError(f"EMA state does not match the model: {sorted(missing)[:5]}")
        # onto the device the averages live on (a checkpoint is read onto the CPU; the student
        # may be on a GPU)
        self.shadow = {k: v.to(self.shadow[k].device, torch.float32).clone() for k, v in state.items()}
