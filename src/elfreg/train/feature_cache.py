"""Frozen features of training examples kept in memory after their first use (``train.feature_cache``).

The encoder and teacher are frozen, so an example's clean states x and its teacher targets never
change during a run. When the data set is small enough to be visited several times (the toy
tasks: tens of thousands of short canvases), computing them once and reusing them saves every
later epoch the two frozen forwards. Features are computed on first visit (by
:func:`elfreg.train.batch.make_batch`, which asks the cache which rows it lacks), so the first
epoch costs what it costs without the cache and nothing is computed up front.

The cache also keeps each example's prompt and answer token ids, so a later epoch does not
tokenise its texts again: a toy demo batch's canvas took 6.4 ms from its texts and 0.32 ms from
kept ids (medians of 600 batches side by side, on a 2-core machine busy with two other runs).

Memory: one float32 (L, d) tensor per example plus (L, D) teacher states when REPA is on; about
1.5 GB for 20,000 toy canvases (their token ids, a few tens of MB more). Leave it off for corpora
that do not fit in memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..text.frozen import TeacherTargets


class FeatureCache:
    """Per-example clean encoder states and teacher targets, keyed by example index."""

    def __init__(self) -> None:
        self._x: dict[int, torch.Tensor] = {}
        self._teacher: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._ids: dict[int, tuple[list[int], list[int]]] = {}

    def __len__(self) -> int:
        return len(self._x)

    def missing(self, indices: list[int]) -> list[int]:
        """Batch rows (positions in ``indices``) whose example has no stored features."""
        return [j for j, i in enumerate(indices) if i not in self._x]

    def store(self, indices: list[int], x: torch.Tensor, teacher: TeacherTargets | None) -> None:
        """Keep row k of ``x`` (and of ``teacher``) as the features of example ``indices[k]``."""
        for k, i in enumerate(indices):
            # clone: a row view would keep its whole batch tensor alive
            self._x[i] = x[k].clone()
            if teacher is not None:
                self._teacher[i] = (teacher.repa[k].clone(), teacher.reg[k].clone(), teacher.reg_repa[k].clone())

    def gather(self, indices: list[int], with_teacher: bool) -> tuple[torch.Tensor, TeacherTargets | None]:
        """Stored features of ``indices``, stacked in that order (every index must be stored)."""
        x = torch.stack([self._x[i] for i in indices])
        if not with_teacher:
            return x, None
        repa, reg, reg_repa = (torch.stack(parts) for parts in zip(*(self._teacher[i] for i in indices),
                                                                    strict=True))
        return x, TeacherTargets(repa=repa, reg=reg, reg_repa=reg_repa)

    def token_ids(self, indices: list[int], tokenize: Callable[[list[int]], tuple[list[list[int]], list[list[int]]]]
                  ) -> tuple[list[list[int]], list[list[int]]]:
        """Prompt and answer token ids of ``indices``, in that order: ``tokenize`` is called once
        with the examples not seen before (each once) and returns their prompts' and answers'
        ids; the rest are read back."""
        new = [i for i in dict.fromkeys(indices) if i not in self._ids]
        if new:
            prompts, answers = tokenize(new)
            self._ids.update(zip(new, zip(prompts, answers, strict=True), strict=True))
        return [self._ids[i][0] for i in indices], [self._ids[i][1] for i in indices]
