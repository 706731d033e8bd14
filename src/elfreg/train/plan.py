"""``elfreg plan --config FILE --gpus N [--peak-tflops X --mfu Y]``: what a run will cost before it
runs (nothing is loaded or downloaded: the student is built on the meta device, the paper's
frozen models are known by shape, others are read from their local HF configs).

Prints model FLOPs per canvas position by component (:mod:`elfreg.train.cost`), memory per GPU,
the data's size and where it came from, and the step time and GPU-hours of the configured budget.
The data size is ``--examples``, else the prepared data's ``stats.json`` (``data.prepared``), else
the lines of a local JSONL ``data.path``, else the paper's Table 8 count of the recipe's row
(``data.paper``). The budget is ``--epochs``, else ``train.epochs`` of that data, else
``train.steps``. Time counts the recompute of activation checkpointing on top of the model FLOPs
that MFU is measured on. The default MFU is the one measured on an H200 by the GPU check
(docs/scaling.md); the GPU-hours are also printed at 10 % and 35 %. The teacher runs only up to
the longest content of a micro-batch; ``--teacher-tokens N`` says how long that is (default: the
whole canvas, an upper bound). ``--compare OTHER.yaml`` adds the GPU-hour ratio of the two configs
at the same settings (``docs/scaling.md`` compares ELF-REG-B with ELF-B this way).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import Config
from ..data.stats import PAPER_TABLE_8
from ..model.presets import student_from_config
from .cost import flops_per_token, frozen_shapes, memory_per_gpu

# MFU of ELF-REG-B's training step measured on one H200 by benchmarks/gpu_smoke.sh (docs/scaling.md)
MEASURED_MFU = 0.209
MFU_RANGE = (0.10, 0.35)


@dataclass
class DataSize:
    """How many examples an epoch has, and where that number came from."""

    examples: int | None
    source: str


@dataclass
class Plan:
    flops: dict[str, float]
    memory: dict[str, float]
    params: dict[str, int]
    data: DataSize
    tokens_per_epoch: int | None  # canvas positions, padding included
    tokens_per_step: int
    steps: int | None  # None: an epoch budget of unknown data
    budget: str  # what decided the steps
    step_seconds: float

    @property
    def gpu_hours(self) -> float | None:
        return None if self.steps is None else self.steps * self.step_seconds * self.gpus / 3600

    gpus: int = 1

    def gpu_hours_at(self, mfu: float, planned_mfu: float) -> float | None:
        """The GPU-hours had the run achieved ``mfu`` instead of the planned one."""
        return None if self.gpu_hours is None else self.gpu_hours * planned_mfu / mfu


def data_size(cfg: Config, examples: int | None = None) -> DataSize:
    """The examples of one epoch of ``cfg``'s data (see the module docstring for the order)."""
    if examples is not None:
        return DataSize(examples, "--examples")
    if cfg.data.prepared:
        stats = Path(cfg.data.prepared) / "stats.json"
        if stats.is_file():
            return DataSize(int(json.loads(stats.read_text())["total"]["samples"]), f"prepared, {stats}")
    path = Path(cfg.data.path) if cfg.data.path else None
    if cfg.data.source == "jsonl" and path is not None and path.is_file():
        with open(path, "rb") as f:
            n = sum(1 for line in f if line.strip())
        return DataSize(min(n, cfg.data.limit) if cfg.data.limit else n, f"lines of {path}")
    if cfg.data.paper:
        return DataSize(PAPER_TABLE_8[cfg.data.paper]["samples"],
                        f"the paper's Table 8, {cfg.data.paper} row; `elfreg data prepare` counts this recipe's own")
    return DataSize(None, "unknown: pass --examples N or prepare the data")


def make_plan(cfg: Config, gpus: int, peak_tflops: float, mfu: float, examples: int | None = None,
              epochs: float | None = None, teacher_tokens: int | None = None) -> Plan:
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if peak_tflops <= 0:
        raise ValueError(f"--peak-tflops must be > 0, got {peak_tflops}")
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu must be in (0, 1], got {mfu}")
    encoder, teacher = frozen_shapes(cfg)
    with torch.device("meta"):
        student = student_from_config(cfg, encoder.width, encoder.vocab, teacher.width if teacher else None)
    params = {"total": sum(p.numel() for p in student.parameters()),
              "muon": sum(p.numel() for p in student.parameters() if p.dim() == 2)}
    flops = flops_per_token(cfg, encoder, teacher, teacher_tokens)
    memory = memory_per_gpu(cfg, params, encoder, teacher, gpus)
    tc = cfg.train
    per_step = tc.batch_size * tc.grad_accum
    tokens_per_step = per_step * cfg.text.canvas_len
    data = data_size(cfg, examples)
    epochs = epochs if epochs is not None else (tc.epochs or None)
    if epochs is None:
        steps, budget = tc.steps, "train.steps"
    elif data.examples is None:
        steps, budget = None, f"{epochs:g} epochs of data of unknown size"
    else:
        steps, budget = math.ceil(epochs * data.examples / per_step), f"{epochs:g} epochs"
    # the hardware also runs activation checkpointing's recompute, which MFU (model FLOPs) leaves out
    step_seconds = tokens_per_step * (flops["total"] + flops["recompute"]) / (gpus * peak_tflops * 1e12 * mfu)
    epoch_tokens = None if data.examples is None else data.examples * cfg.text.canvas_len
    return Plan(flops, memory, params, data, epoch_tokens, tokens_per_step, steps, budget, step_seconds, gpus)


def format_plan(name: str, cfg: Config, plan: Plan, gpus: int, peak: float, mfu: float) -> str:
    g = 1e9
    f = plan.flops
    lines = [f"plan for {name}: {gpus} GPU(s), train.parallel={cfg.train.parallel}, peak {peak:g} TFLOP/s, "
             f"MFU {mfu:.1%}",
             f"student parameters: {plan.params['total'] / 1e6:.1f}M",
             "model FLOPs per canvas token (GFLOP):"]
    for key in ("student_fwd_bwd", "self_cond_aux", "decoder_head", "frozen_encoder", "frozen_teacher", "total"):
        lines.append(f"  {key:<16} {f[key] / g:8.3f}  ({f[key] / f['total']:5.1%})")
    if f["recompute"]:
        lines.append(f"  {'recompute':<16} {f['recompute'] / g:8.3f}  (activation checkpointing; not in MFU)")
    lines.append("memory per GPU (GB):")
    for key, value in plan.memory.items():
        lines.append(f"  {key:<20} {value / 1e9:8.2f}")
    examples = "unknown" if plan.data.examples is None else f"{plan.data.examples:,}"
    lines.append(f"data: {examples} examples per epoch ({plan.data.source})")
    if plan.tokens_per_epoch is not None:
        lines.append(f"tokens per epoch: {plan.data.examples:,} examples × {cfg.text.canvas_len} canvas = "
                     f"{plan.tokens_per_epoch / 1e9:.3f}B (padding included)")
    lines.append(f"step: {plan.tokens_per_step:,} canvas tokens, {plan.step_seconds:.3f} s")
    if plan.steps is None:
        lines.append(f"budget: {plan.budget}: pass --examples N or prepare the data")
    else:
        lo, hi = MFU_RANGE
        lines.append(f"budget ({plan.budget}): {plan.steps:,} steps = {plan.steps * plan.step_seconds / 3600:.1f} h "
                     f"wall, {plan.gpu_hours:.1f} GPU-hours at MFU {mfu:.1%} ({plan.gpu_hours_at(hi, mfu):.1f} at "
                     f"{hi:.0%}, {plan.gpu_hours_at(lo, mfu):.1f} at {lo:.0%})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cfg = Config.load(args.config, args.override)
    peak = args.peak_tflops if args.peak_tflops is not None else cfg.train.peak_tflops
    plan = make_plan(cfg, args.gpus, peak, args.mfu, args.examples, args.epochs, args.teacher_tokens)
    print(format_plan(args.config, cfg, plan, args.gpus, peak, args.mfu))
    if args.compare:
        other_cfg = Config.load(args.compare, args.override)
        other = make_plan(other_cfg, args.gpus, peak, args.mfu, args.examples, args.epochs, args.teacher_tokens)
        if plan.gpu_hours is None or other.gpu_hours is None:
            raise ValueError("--compare needs both budgets: pass --examples N or prepare the data")
        print(f"GPU-hours {args.config} / {args.compare}: {plan.gpu_hours:.1f} / {other.gpu_hours:.1f} = "
              f"{plan.gpu_hours / other.gpu_hours:.2f}x (FLOPs per token {plan.flops['total'] / 1e9:.2f} / "
              f"{other.flops['total'] / 1e9:.2f} GFLOP)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="FLOPs, memory, step time and GPU-hours of a run config")
    p.add_argument("--config", required=True, help="a run config (YAML)")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="peak TFLOP/s per GPU (default train.peak_tflops: 989, H100/H200 dense bf16)")
    p.add_argument("--mfu", type=float, default=MEASURED_MFU,
                   help=f"model FLOPs utilisation (default {MEASURED_MFU}: ELF-REG-B measured on one H200)")
    p.add_argument("--examples", type=int, default=None,
                   help="training examples per epoch (default: prepared stats.json, a local jsonl data.path, or "
                        "the paper's Table 8 row of data.paper)")
    p.add_argument("--epochs", type=float, default=None, help="budget in epochs (default: train.epochs, else "
                                                            "train.steps)")
    p.add_argument("--teacher-tokens", type=int, default=None,
                   help="positions the teacher runs per example: the longest content (prompt + answer) of a "
                        "micro-batch (default: the canvas length, an upper bound)")
    p.add_argument("--compare", default=None, help="another config: print the GPU-hour ratio")
    p.add_argument("override", nargs="*", help="key.sub=value overrides (applied to both configs)")
    p.set_defaults(func=run)
