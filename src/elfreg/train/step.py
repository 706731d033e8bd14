"""One optimisation step of ELF-REG training, as a function of a run and the step number."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from ..device import autocast
from ..flow.objective import TrainBatch, elf_reg_loss
from ..text.canvas import Canvas
from .batch import example_indices, make_batch, prompt_drops, rank_share, row_draws
from .build import Run
from .optim import lr_at
from .parallel import backward_scale, no_gradient_sync

PHASES = ("train_step.forward", "train_step.backward", "train_step.optimizer", "train_step.ema")
"""The profiler labels of a step's parts (the losses' forward pass, their backward pass, clipping
and the optimiser, the EMA update): ``benchmarks/student_width_ab.py --phase-steps`` times each.
Outside a profiler a label costs microseconds."""


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
    """Canvas positions the step trained on, over all ranks (padding included)."""
    real_tokens: int = 0
    """The same without padding (prompt, answer and one EOS per example)."""
    reads: list[float] | None = None
    """The frozen models' reads during the step, over all ranks: encoder positions and
    positions × length, then the teacher's (what :class:`~elfreg.train.cost.Throughput` counts
    their FLOPs from)."""


def micro_rows(run: Run, k: int) -> list[int]:
    """This rank's rows of global micro-batch ``k``: places 0 … B−1 in it (B = ``train.batch_size``)."""
    return rank_share(range(run.cfg.train.batch_size), run.dist.rank, run.dist.world)


def micro_batch(run: Run, k: int) -> TrainBatch:
    """This rank's share of micro-batch ``k`` of the run (0-based, counted over all steps): of the
    ``train.batch_size`` examples at positions ``[k·B, (k+1)·B)`` of the data order, the rows
    :func:`micro_rows` names (all of them on one process), those :func:`prompt_drops` picks
    without their prompt."""
    tc = run.cfg.train
    rows = micro_rows(run, k)
    indices = example_indices(len(run.examples), tc.seed, k * tc.batch_size + rows[0], len(rows))
    dropped = prompt_drops(tc.seed, k, rows, run.cfg.flow.prompt_drop)
    return make_batch(run.frozen, run.examples, indices, run.with_teacher, run.device, run.cache, dropped)


def train_step(run: Run, step: int) -> StepResult:
    """Optimiser step ``step`` (0-based): learning rate, then ``train.grad_accum`` micro-batches
    ``step·A … step·A + A − 1`` of L = L_ELF + 0.5·L_REPA + 0.1·L_REG (ELF-REG §3, App. A, weights from
    ``loss``; or the loss of the run's :attr:`~elfreg.train.build.Run.objective`) each
    backpropagated with weight 1/A, gradient clipping, the optimiser, EMA update.

    Each row's random draws come from its own generator (:func:`~elfreg.train.batch.row_draws`),
    and each term is averaged over the global micro-batch, so every rank count computes the same
    losses and gradients. The logged values are summed over ranks (each rank's term is its share
    of the global one) before the check for a non-finite loss, so every rank sees the same values
    and a non-finite loss raises :class:`TrainingDiverged` on every rank before its backward pass
    and before the optimiser step (the weights are those after step ``step − 1``).
    """
    tc = run.cfg.train
    lr = lr_at(step, tc)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    run.optimizer.zero_grad(set_to_none=True)
    scale = backward_scale(run.cfg, run.dist) / tc.grad_accum
    reduce_counts = run.dist.sum if run.dist.world > 1 else None
    sums: dict[str, float] = {}
    tokens = torch.zeros(6, dtype=torch.float64)  # canvas, unpadded, frozen reads (see StepResult.reads)
    reads_before = frozen_reads(run)
    for micro in range(tc.grad_accum):
        k = step * tc.grad_accum + micro
        batch = micro_batch(run, k)
        draws = row_draws(tc.seed, k, micro_rows(run, k), run.device)
        with no_gradient_sync(run.model, run.cfg, micro == tc.grad_accum - 1):
            with autocast(run.device, run.bf16), record_function(PHASES[0]):
                if run.objective is None:
                    out = run.model(elf_reg_loss, batch, run.cfg.flow, run.cfg.loss, draws, reduce_counts)
                else:
                    out = run.model(run.objective.loss, batch, draws, reduce_counts)
            terms = {k: v.detach().float() for k, v in out.__dict__.items()}
            values = dict(zip(terms, run.dist.sum(torch.stack(list(terms.values()))).tolist(), strict=True))
            if not all(math.isfinite(v) for v in values.values()):
                raise TrainingDiverged(
                    f"non-finite loss at step {step + 1}: {values}; the run stopped, last good "
                    f"checkpoint: {run.last_checkpoint or 'none yet'}")
            with record_function(PHASES[1]):
                (out.total * scale).backward()
        for key, v in values.items():
            sums[key] = sums.get(key, 0.0) + v / tc.grad_accum
        canvas = batch.canvas
        tokens[:2] += torch.tensor([canvas.tokens.numel(), real_tokens(canvas)], dtype=torch.float64)
    with record_function(PHASES[2]):
        grad_norm = torch.nn.utils.clip_grad_norm_(run.student.parameters(), tc.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        run.optimizer.step()
    with record_function(PHASES[3]):
        run.ema.update(run.student)
    tokens[2:] = torch.tensor(frozen_reads(run), dtype=torch.float64) - torch.tensor(reads_before, dtype=torch.float64)
    total, real, *reads = run.dist.sum(tokens).tolist()
    return StepResult(losses=sums, lr=lr, grad_norm=float(grad_norm), tokens=int(total), real_tokens=int(real),
                      reads=reads)


def frozen_reads(run: Run) -> list[float]:
    """How much the frozen encoder and teacher have read so far on this rank (positions and
    positions × length, each), what their FLOPs are counted from."""
    readers = [run.frozen.encoder.reader, run.frozen.teacher.reader if run.with_teacher else None]
    return [float(getattr(r, name, 0)) if r is not None else 0.0 for r in readers for name in ("positions", "squares")]


def real_tokens(canvas: Canvas) -> int:
    """Canvas positions that are not padding: prompt and answer tokens plus one EOS per row (the
    paper's token count: prompt, answer and EOS, padding excluded)."""
    return int((~canvas.special_mask).sum()) + canvas.tokens.shape[0]
