"""A bf16 inference copy of a student, kept in step with the student's weights.

Under bf16 autocast every ``nn.Linear`` casts its fp32 weight and bias to bf16 on every call:
for an ELF-REG-B student that is about 0.5 GB of memory traffic per network call. Sampling makes
the same cast tens of times per answer, so :class:`Bf16Copy` makes it once (on a 2-core CPU this
measured 1.03× at B batch 1 with two threads and 1.20× with one, docs/performance.md; the copy
holds 0.5 GB for that): a copy of the student whose blocks' ``nn.Linear``
weights and biases are stored in bf16, everything else (norm weights, the fp32 input path,
prefix tokens and heads) as in the student. Run under the same autocast, the copy computes exactly what the student
computes — autocast would have cast those tensors to bf16 with the same rounding — and
``tests/model/test_model_inference.py`` checks that bit for bit.

The copy follows the student: it is rebuilt when any parameter of the student has been
changed in place (an optimiser step, ``load_state_dict``) or replaced since the copy was made,
so a network held across training steps never samples stale weights.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def _stamp(module: nn.Module) -> tuple[tuple[int, int], ...]:
    # Tensor._version counts in-place writes; with data_ptr it also notices a replaced tensor.
    return tuple((p.data_ptr(), p._version) for p in module.parameters())


def bf16_matmul_copy(module: nn.Module) -> nn.Module:
    """A frozen eval-mode copy of ``module`` with the parameters of every ``nn.Linear`` of its
    Transformer blocks (``module.blocks``; all of ``module`` when it has none) in bf16. A
    student's input path and heads stay fp32: they run outside autocast (ELF's network)."""
    dup = copy.deepcopy(module).eval().requires_grad_(False)
    for p in dup.parameters():
        p.grad = None
    for m in getattr(dup, "blocks", dup).modules():
        if isinstance(m, nn.Linear):
            m.to(torch.bfloat16)
    return dup


class Bf16Copy:
    """The bf16 inference copy of ``source`` (:func:`bf16_matmul_copy`), rebuilt whenever
    ``source``'s parameters have changed since the last :meth:`get`."""

    def __init__(self, source: nn.Module):
        self.source = source
        self._copy: nn.Module | None = None
        self._stamp: tuple | None = None

    def get(self) -> nn.Module:
        stamp = _stamp(self.source)
        if self._copy is None or stamp != self._stamp:
            self._copy, self._stamp = bf16_matmul_copy(self.source), stamp
        return self._copy
