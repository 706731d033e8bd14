"""One optimisation step of ELF-REG training, as a function of a run and the step number."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..device import autocast
from ..flow.objective import TrainBatch, elf_reg_loss
from .batch import example_indices, make_batch
from .build import Run
from .optim import lr_at


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the run stopped and its last good checkpoint is untouched."""


@dataclass
class StepResult:
    """What one optimisation step measured."""

    losses: dict[str, float]
    """Each loss term (``total``, ``elf``, ``repa``, ``reg``, ...) averaged over the micro-batches."""
    lr: float
    grad_norm: float
    """Gradient norm before clipping."""
    tokens: int
    """Canvas positions the step trained on (padding included)."""


def micro_batch(run: Run, k: int) -> TrainBatch:
    """Micro-batch ``k`` of the run (0-based, counted over all steps): the ``train.batch_size``
    examples at positions ``[k·B, (k+1)·B)`` of the data order."""
    tc = run.cfg.train
    indices = example_indices(len(run.examples), tc.seed, k * tc.batch_size, tc.batch_size)
    return make_batch(run.frozen, run.examples, indices, run.with_teacher, run.device, run.cache)


def train_step(run: Run, step: int) -> StepResult:
    """Optimiser step ``step`` (0-based): learning rate, then ``train.grad_accum`` micro-batches
    ``step·A … step·A + A − 1`` of L = L_ELF + 0.5·L_REPA + 0.1·L_REG (spec §3, weights from
    ``loss``) each backpropagated with weight 1/A, gradient clipping, AdamW, EMA update.

    Every random draw comes from ``run.generator``, in micro-batch order. A non-finite loss
    raises :class:`TrainingDiverged` before its backward pass and before the optimiser step, so
    the weights are those after step ``step − 1``.
    """
    tc = run.cfg.train
    lr = lr_at(step, tc)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    run.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    tokens = 0
    for micro in range(tc.grad_accum):
        batch = micro_batch(run, step * tc.grad_accum + micro)
        with autocast(run.device, run.bf16):
            out = elf_reg_loss(run.student, batch, run.cfg.flow, run.cfg.loss, run.generator)
        values = out.as_floats()
        if not all(math.isfinite(v) for v in values.values()):
            raise TrainingDiverged(
                f"non-finite loss at step {step + 1}: {values}; the run stopped, last good "
                f"checkpoint: {run.last_checkpoint or 'none yet'}")
        (out.total / tc.grad_accum).backward()
        for key, v in values.items():
            sums[key] = sums.get(key, 0.0) + v / tc.grad_accum
        tokens += batch.canvas.tokens.numel()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.student.parameters(), tc.grad_clip)
    run.optimizer.step()
    run.ema.update(run.student)
    return StepResult(losses=sums, lr=lr, grad_norm=float(grad_norm), tokens=tokens)
