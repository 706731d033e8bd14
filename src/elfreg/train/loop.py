"""The training loop: steps, progress bar, ``metrics.jsonl``, checkpoint cadence, ``stop_at``.

Exact resume: the data order is a pure function of (seed, micro-batch index), and every random
draw of the objective comes from one generator whose state is saved with each checkpoint, so
``2N`` uninterrupted steps and ``N`` + resume + ``N`` produce the same losses.

:func:`train` is :func:`~elfreg.train.build.start_run` followed by :func:`train_loop`; the loop
only calls :func:`~elfreg.train.step.train_step` and :func:`save`, so a scale-out layer wraps
those (and the build) without touching the loop.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..checkpoint import save_checkpoint
from ..config import Config
from ..data.examples import Example
from .build import Run, start_run, train_state
from .step import TrainingDiverged, train_step

__all__ = ["TrainResult", "TrainingDiverged", "save", "train", "train_loop"]


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
    with open(run.run_dir / "metrics.jsonl", "a") as log:
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
                log.write(json.dumps({"step": step, "lr": result.lr, "grad_norm": result.grad_norm,
                                      "tokens_per_s": rate, **terms}) + "\n")
                log.flush()
            if step % tc.ckpt_every == 0 or step == end:
                save(run, step)
    bar.close()
    return TrainResult(run.run_dir, step, terms, run.last_checkpoint)


def train(cfg: Config, examples: list[Example] | None = None, resume: bool = True,
          stop_at: int | None = None) -> TrainResult:
    """Train a student as ``cfg`` says; resumes from ``train.out_dir`` when it holds a checkpoint
    (``resume=False`` refuses such a folder with ``FileExistsError``).

    ``stop_at`` ends this invocation after that step (with a checkpoint) without changing the
    schedule, so long jobs can run in slices and resume exactly.
    """
    run, step = start_run(cfg, examples, resume_existing=resume)
    return train_loop(run, step, stop_at)
