"""The training loop: steps, progress bar, ``metrics.jsonl``, checkpoint cadence, ``stop_at``.

Exact resume: the data order is a pure function of (seed, micro-batch index), and every random
draw of the objective is a function of (seed, micro-batch index, position in the global batch)
(:func:`~elfreg.train.batch.row_draws`), so ``2N`` uninterrupted steps and ``N`` + resume + ``N``
produce the same losses, at any number of ranks on either side of the resume.

:func:`train` is :func:`~elfreg.train.build.start_run` followed by :func:`train_loop`; the loop
only calls :func:`~elfreg.train.step.train_step` and :func:`save`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..checkpoint import save_checkpoint
from ..config import Config
from ..distributed import env_dist
from ..host_memory import apply_host_memory
from ..jsonl import append_jsonl
from ..model.student import STUDENT_FORMAT
from ..runs import GracefulInterrupt, locked
from .batch import TrainingData
from .build import Run, start_run, train_state
from .cost import Throughput
from .sharded import save_sharded
from .step import TrainingDiverged, train_step

__all__ = ["TrainResult", "TrainingDiverged", "TrainingInterrupted", "save", "train", "train_loop"]


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the run after a finished step, which was checkpointed."""

    exit_status = 130

    def __init__(self, signal_name: str, step: int, checkpoint: Path):
        super().__init__(f"interrupted by {signal_name} after step {step}; checkpoint saved at {checkpoint}; "
                         "run the same command to resume")
        self.step, self.checkpoint = step, checkpoint


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    last_losses: dict[str, float]
    checkpoint: Path | None


def save(run: Run, step: int) -> Path:
    """Checkpoint ``run`` as it is after ``step`` steps (atomic; see :mod:`elfreg.checkpoint`)
    and remember it as the run's last good checkpoint."""
    meta = {"student_format": STUDENT_FORMAT, "enc_dim": run.frozen.encoder.width,
            "vocab_size": run.student.vocab_size,
            "teacher_dim": run.frozen.teacher.width if run.with_teacher else None,
            "canvas": run.frozen.canvas.stats.as_dict(), "world_size": run.dist.world,
            "parallel": run.cfg.train.parallel, **run.meta}
    if step in run.kept:
        meta["kept_epoch"] = run.kept[step]
    if run.cfg.train.parallel != "none":  # every rank writes its shards
        run.last_checkpoint = save_sharded(run, step, meta)
    else:
        run.last_checkpoint = save_checkpoint(run.run_dir, step, run.cfg, run.student, run.ema.state_dict(),
                                              train_state(run), meta)
    return run.last_checkpoint


def train_loop(run: Run, step: int, stop_at: int | None = None) -> TrainResult:
    """Train ``run`` from ``step`` steps done to ``train.steps`` (or ``stop_at``, if earlier).

    Logs a ``metrics.jsonl`` line every ``train.log_every`` steps and at the last step (loss
    terms, tokens/s with and without padding, model FLOPs per token by component and MFU), and
    checkpoints every ``train.ckpt_every`` steps and where this call stops. Only rank 0 writes
    metrics and draws the bar; a signal seen by any rank stops every rank after the same step.
    """
    tc = run.cfg.train
    main = run.dist.is_main
    end = min(tc.steps, stop_at) if stop_at is not None else tc.steps
    terms: dict[str, float] = {}
    bar = tqdm(total=tc.steps, initial=step, desc="train", disable=not (tc.progress and main), dynamic_ncols=True)
    speed = Throughput.of_run(run)
    with GracefulInterrupt() as stop:
        while step < end:
            t0 = time.perf_counter()
            result = train_step(run, step)
            speed.add(result.tokens, result.real_tokens, time.perf_counter() - t0, result.reads)
            step += 1
            terms = result.losses
            bar.update(1)
            if step % tc.log_every == 0 or step == tc.steps:
                rates = speed.report()
                bar.set_postfix(loss=f"{terms['total']:.3f}", dec=f"{terms['decode']:.2f}",
                                den=f"{terms['denoise']:.3f}", tok_s=f"{rates['tokens_per_s']:.0f}")
                if main:
                    append_jsonl(run.run_dir / "metrics.jsonl", {"step": step, "lr": result.lr,
                                                                 "grad_norm": result.grad_norm, **rates, **terms})
            stopping = _any_rank(run, stop.requested)
            if step % tc.ckpt_every == 0 or step == end or stopping or step in run.kept:
                save(run, step)
            if stopping and step < end:
                bar.close()
                raise TrainingInterrupted(stop.signal_name or "a signal to another rank", step, run.last_checkpoint)
    bar.close()
    return TrainResult(run.run_dir, step, terms, run.last_checkpoint)


def _any_rank(run: Run, flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (every rank gets the same answer)."""
    if run.dist.world == 1:
        return flag
    return bool(run.dist.sum(torch.tensor([float(flag)])).item() > 0)


def train(cfg: Config, examples: TrainingData | None = None, resume: bool = True,
          stop_at: int | None = None) -> TrainResult:
    """Train a student as ``cfg`` says; resumes from ``train.out_dir`` when it holds a checkpoint
    (``resume=False`` refuses such a folder with ``FileExistsError``). With ``train.host_memory:
    keep`` the process's malloc keeps freed memory for reuse from here on
    (:func:`~elfreg.host_memory.apply_host_memory`).

    The run folder is locked for the whole call (a second process refuses with
    :class:`~elfreg.runs.FolderInUse`); under torchrun rank 0 holds the lock for the job (the
    folder is shared by all ranks; a second job's rank 0 refuses). SIGINT or SIGTERM finish the
    current step, checkpoint it and raise :class:`TrainingInterrupted`; a second signal stops at
    once. ``stop_at`` ends this invocation after that step (with a checkpoint) without changing
    the schedule, so long jobs can run in slices and resume exactly.
    """
    apply_host_memory(cfg.train.host_memory)
    with locked(cfg.train.out_dir) if env_dist().is_main else nullcontext():
        run, step = start_run(cfg, examples, resume_existing=resume)
        return train_loop(run, step, stop_at)
