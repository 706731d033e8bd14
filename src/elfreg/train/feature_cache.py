"""Frozen features of training examples kept in memory after their first use (``train.feature_cache``).

The encoder and teacher are frozen, so an example's clean states x and its teacher targets never
change during a run. When the data set is small enough to be visited several times (the toy
tasks: tens of thousands of short canvases), computing them once and reusing them saves every
later epoch the two frozen forwards. Features are computed on first visit, so the first epoch
costs what it costs without the cache and nothing is computed up front.

Memory: one float32 (L, d) tensor per example plus (L, D) teacher states when REPA is on; about
1.5 GB for 20,000 toy canvases. Leave it off for corpora that do not fit in memory.
"""

from __future__ import annotations

import torch

from ..data.examples import Example
from ..flow.objective import TrainBatch
from ..text.frozen import TeacherTargets
from ..text.load import FrozenText


class FeatureCache:
    """Per-example clean encoder states and teacher targets, filled lazily."""

    def __init__(self) -> None:
        self._x: dict[int, torch.Tensor] = {}
        self._teacher: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._x)

    def batch(self, frozen: FrozenText, examples: list[Example], indices: list[int], with_teacher: bool,
              device: torch.device) -> TrainBatch:
        chosen = [examples[i] for i in indices]
        canvas = frozen.canvas.build([e.prompt for e in chosen], [e.answer for e in chosen]).to(device)
        missing = [j for j, i in enumerate(indices) if i not in self._x]
        if missing:
            rows = torch.tensor(missing, device=device)
            sub = canvas.select(rows)
            x = frozen.encoder.encode(sub.tokens)
            targets = frozen.teacher.targets(sub) if with_teacher else None
            for k, j in enumerate(missing):
                self._x[indices[j]] = x[k].clone()
                if targets is not None:
                    self._teacher[indices[j]] = (targets.repa[k].clone(), targets.reg[k].clone(),
                                                 targets.reg_repa[k].clone())
        x = torch.stack([self._x[i] for i in indices])
        teacher = None
        if with_teacher:
            repa, reg, reg_repa = (torch.stack(parts) for parts in zip(*(self._teacher[i] for i in indices),
                                                                        strict=True))
            teacher = TeacherTargets(repa=repa, reg=reg, reg_repa=reg_repa)
        return TrainBatch(canvas=canvas, x=x, teacher=teacher)
