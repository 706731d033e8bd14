"""The training loop: frozen features on the fly, the ELF-REG objective, AdamW, EMA, checkpoints.

Exact resume: the data order is a pure function of (seed, micro-batch index), and every random
draw of the objective comes from one generator whose state is saved with each checkpoint, so
``2N`` uninterrupted steps and ``N`` + resume + ``N`` produce the same losses.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..checkpoint import open_checkpoint, resolve_checkpoint, save_checkpoint
from ..config import Config
from ..data.examples import Example, load_examples
from ..device import autocast, resolve_device, use_bf16
from ..flow.objective import elf_reg_loss
from ..model.presets import student_from_config
from ..text.load import load_frozen_text
from .batch import build_canvas, example_indices, make_batch
from .ema import EMA
from .feature_cache import FeatureCache
from .optim import lr_at, make_optimizer

REG_CALIBRATION_EXAMPLES = 256


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the run stopped and its last good checkpoint is untouched."""


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    last_losses: dict[str, float]
    checkpoint: Path | None


def _check_resumable(cfg: Config, saved: Config) -> None:
    for section in ("text", "model", "flow", "loss"):
        if getattr(cfg, section) != getattr(saved, section):
            raise ValueError(
                f"the run folder holds a checkpoint made with a different '{section}' config; "
                "use a new train.out_dir (or the same config) to continue")


def train(cfg: Config, examples: list[Example] | None = None, resume: bool = True,
          stop_at: int | None = None) -> TrainResult:
    """Train a student as ``cfg`` says; resumes from ``train.out_dir`` when it holds a checkpoint.

    ``stop_at`` ends this invocation after that step (with a checkpoint) without changing the
    schedule, so long jobs can run in slices and resume exactly.
    """
    tc = cfg.train
    device = resolve_device(tc.device)
    bf16 = use_bf16(device, tc.precision)
    run_dir = Path(tc.out_dir)
    existing = resolve_checkpoint(run_dir)
    if existing is not None and not resume:
        raise FileExistsError(f"{run_dir} already holds checkpoints; refusing to overwrite (use a new out_dir)")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(tc.seed)

    with_teacher = cfg.loss.needs_teacher
    frozen = load_frozen_text(cfg.text, with_teacher=with_teacher, device=device, bf16=bf16)
    examples = examples if examples is not None else load_examples(cfg.data)
    if not examples:
        raise ValueError("no training examples")
    teacher_dim = frozen.teacher.width if with_teacher else None
    student = student_from_config(cfg, frozen.encoder.width, frozen.encoder.vocab_size, teacher_dim).to(device)
    optimizer = make_optimizer(student, tc)
    ema = EMA(student, tc.ema_decay)
    generator = torch.Generator(device=device).manual_seed(tc.seed)
    meta = {"enc_dim": frozen.encoder.width, "vocab_size": frozen.encoder.vocab_size, "teacher_dim": teacher_dim}

    step = 0
    if existing is not None:
        ckpt = open_checkpoint(existing)
        _check_resumable(cfg, ckpt.config)
        student.load_state_dict(ckpt.model_state())
        ema.load_state_dict(ckpt.ema_state())
        state = ckpt.train_state()
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        if with_teacher:
            frozen.teacher.reg_mean, frozen.teacher.reg_std = state["reg_mean"], state["reg_std"]
        step = ckpt.meta["step"]
    elif with_teacher:
        calib = example_indices(len(examples), tc.seed + 1, 0, min(REG_CALIBRATION_EXAMPLES, len(examples)))
        chunks = [calib[i:i + tc.batch_size] for i in range(0, len(calib), tc.batch_size)]
        frozen.teacher.calibrate([build_canvas(frozen, examples, c, device) for c in chunks])
    cfg.save(run_dir / "config.yaml")

    def save(at: int) -> Path:
        state = {"optimizer": optimizer.state_dict(), "generator": generator.get_state()}
        if with_teacher:
            state.update(reg_mean=frozen.teacher.reg_mean, reg_std=frozen.teacher.reg_std)
        return save_checkpoint(run_dir, at, cfg, student, ema.state_dict(), state,
                               {**meta, "canvas": frozen.canvas.stats.as_dict()})

    cache = FeatureCache() if tc.feature_cache else None
    last_ckpt = resolve_checkpoint(run_dir)
    terms: dict[str, float] = {}
    bar = tqdm(total=tc.steps, initial=step, desc="train", disable=not tc.progress, dynamic_ncols=True)
    tokens_seen, t0 = 0, time.perf_counter()
    with open(run_dir / "metrics.jsonl", "a") as log:
        end = min(tc.steps, stop_at) if stop_at is not None else tc.steps
        while step < end:
            lr = lr_at(step, tc)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            for micro in range(tc.grad_accum):
                k = step * tc.grad_accum + micro
                indices = example_indices(len(examples), tc.seed, k * tc.batch_size, tc.batch_size)
                batch = make_batch(frozen, examples, indices, with_teacher, device, cache)
                with autocast(device, bf16):
                    out = elf_reg_loss(student, batch, cfg.flow, cfg.loss, generator)
                values = out.as_floats()
                if not all(math.isfinite(v) for v in values.values()):
                    raise TrainingDiverged(
                        f"non-finite loss at step {step + 1}: {values}; the run stopped, last good "
                        f"checkpoint: {last_ckpt or 'none yet'}")
                (out.total / tc.grad_accum).backward()
                for key, v in values.items():
                    sums[key] = sums.get(key, 0.0) + v / tc.grad_accum
                tokens_seen += batch.canvas.tokens.numel()
            grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), tc.grad_clip)
            optimizer.step()
            ema.update(student)
            step += 1
            terms = sums
            bar.update(1)
            if step % tc.log_every == 0 or step == tc.steps:
                rate = tokens_seen / max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(loss=f"{terms['total']:.3f}", dec=f"{terms['decode']:.2f}",
                                den=f"{terms['denoise']:.3f}", tok_s=f"{rate:.0f}")
                log.write(json.dumps({"step": step, "lr": lr, "grad_norm": float(grad_norm),
                                      "tokens_per_s": rate, **terms}) + "\n")
                log.flush()
            if step % tc.ckpt_every == 0 or step == end:
                last_ckpt = save(step)
    bar.close()
    return TrainResult(run_dir, step, terms, last_ckpt)
