"""The training loop: steps, progress bar, ``metrics.jsonl``, checkpoint cadence, ``stop_at``.

Exact resume: the data order is a pure function of (seed, micro-batch index), and every random
draw of the objective comes from one generator whose state is saved with each checkpoint, so
``2N`` uninterrupted steps and ``N`` + resume + ``N`` produce the same losses.

:func:`train` is :func:`~elfreg.train.build.start_run` followed by :func:`train_loop`; the loop
only calls :func:`~elfreg.train.step.train_step` and :func:`save`, so a scale-out layer wraps
those (and the build) without touching the loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..checkpoint import save_checkpoint
from ..config import Config
from ..jsonl import append_jsonl
from ..runs import GracefulInterrupt, locked
from .batch import TrainingData
from .build import Run, start_run, train_state
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
    meta = {"enc_dim": run.frozen.encoder.width, "vocab_size": run.frozen.encoder.vocab_size,
            "teacher_dim": run.frozen.teacher.width if run.with_teacher else None,
            "canvas": run.frozen.canvas.stats.as_dict()}
    run.last_checkpoint = save_checkpoint(run.run_dir, step, run.cfg, run.student, run.ema.state_dict(),
                                          train_state(run), meta)
    return run.last_checkpoint


def train_loop(run: Run, step: int, stop_at: int | None = None) -> TrainResult:
    """Train ``run`` from ``step`` steps done to ``train.steps`` (or ``stop_at``, if earlier).

    Logs a ``metrics.jsonl`` line every ``train.log_every`` steps and at the last step, and
    checkpoints every ``train.ckpt_every`` steps and where this call stops.
    """
    tc = run.cfg.train
    end = min(tc.steps, stop_at) if stop_at is not None else tc.steps
    terms: dict[str, float] = {}
    bar = tqdm(total=tc.steps, initial=step, desc="train", disable=not tc.progress, dynamic_ncols=True)
    tokens_seen, t0 = 0, time.perf_counter()
    with GracefulInterrupt() as stop:
        while step < end:
            result = train_step(run, step)
            step += 1
            terms = result.losses
            tokens_seen += result.tokens
            bar.update(1)
            if step % tc.log_every == 0 or step == tc.steps:
                rate = tokens_seen / max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(loss=f"{terms['total']:.3f}", dec=f"{terms['decode']:.2f}",
                                den=f"{terms['denoise']:.3f}", tok_s=f"{rate:.0f}")
                append_jsonl(run.run_dir / "metrics.jsonl", {"step": step, "lr": result.lr,
                                                             "grad_norm": result.grad_norm, "tokens_per_s": rate,
                                                             **terms})
            if step % tc.ckpt_every == 0 or step == end or stop.requested:
                save(run, step)
            if stop.requested and step < end:
                bar.close()
                raise TrainingInterrupted(stop.signal_name, step, run.last_checkpoint)
    bar.close()
    return TrainResult(run.run_dir, step, terms, run.last_checkpoint)


def train(cfg: Config, examples: TrainingData | None = None, resume: bool = True,
          stop_at: int | None = None) -> TrainResult:
    """Train a student as ``cfg`` says; resumes from ``train.out_dir`` when it holds a checkpoint
    (``resume=False`` refuses such a folder with ``FileExistsError``).

    The run folder is locked for the whole call (a second process refuses with
    :class:`~elfreg.runs.FolderInUse`). SIGINT or SIGTERM finish the current step, checkpoint it
    and raise :class:`TrainingInterrupted`; a second signal stops at once. ``stop_at`` ends this
    invocation after that step (with a checkpoint) without changing the schedule, so long jobs
    can run in slices and resume exactly.
    """
    with locked(cfg.train.out_dir):
        run, step = start_run(cfg, examples, resume_existing=resume)
        return train_loop(run, step, stop_at)
