"""``elfreg plan --config FILE --gpus N [--peak-tflops X --mfu Y]``: what a run will cost before it
runs (nothing is loaded or downloaded: the student is built on the meta device, the paper's
frozen models are known by shape, others are read from their local HF configs).

Prints model FLOPs per canvas position by component (:mod:`elfreg.train.cost`), memory per GPU,
tokens per epoch (from ``--examples``, or counted in a local ``data.path`` JSONL file), and the
step time and GPU-hours of the configured budget (``train.steps``, or ``--epochs`` of the data)
at the given peak and MFU. The teacher runs only up to the longest content of a micro-batch;
``--teacher-tokens N`` says how long that is (default: the whole canvas, an upper bound).
``--compare OTHER.yaml`` adds the GPU-hour ratio of the two configs
at the same settings (``docs/scaling.md`` compares ELF-REG-B with ELF-B this way).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import Config
from ..model.presets import student_from_config
from .cost import flops_per_token, frozen_shapes, memory_per_gpu

DEFAULT_MFU = 0.35


@dataclass
class Plan:
    flops: dict[str, float]
    memory: dict[str, float]
    params: dict[str, int]
    examples_per_epoch: int | None
    tokens_per_epoch: int | None  # canvas positions, padding included
    tokens_per_step: int
    steps: int
    step_seconds: float
    gpu_hours: float


def count_examples(cfg: Config) -> int | None:
    """Examples in a local JSONL ``data.path`` (after ``data.limit``), else None."""
    path = Path(cfg.data.path) if cfg.data.path else None
    if cfg.data.source != "jsonl" or path is None or not path.is_file():
        return None
    with open(path, "rb") as f:
        n = sum(1 for line in f if line.strip())
    return min(n, cfg.data.limit) if cfg.data.limit else n


def make_plan(cfg: Config, gpus: int, peak_tflops: float, mfu: float, examples: int | None = None,
              epochs: float | None = None, teacher_tokens: int | None = None) -> Plan:
    if gpus < 1 or peak_tflops <= 0 or not 0 < mfu <= 1:
        raise ValueError("--gpus must be >= 1, --peak-tflops > 0 and --mfu in (0, 1]")
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
    examples = examples if examples is not None else count_examples(cfg)
    if epochs is not None:
        if examples is None:
            raise ValueError("--epochs needs the data size: pass --examples N (or a local jsonl data.path)")
        steps = math.ceil(epochs * examples / per_step)
    else:
        steps = tc.steps
    step_seconds = tokens_per_step * flops["total"] / (gpus * peak_tflops * 1e12 * mfu)
    epoch_tokens = None if examples is None else examples * cfg.text.canvas_len
    return Plan(flops, memory, params, examples, epoch_tokens, tokens_per_step, steps, step_seconds,
                steps * step_seconds * gpus / 3600)


def format_plan(name: str, cfg: Config, plan: Plan, gpus: int, peak: float, mfu: float) -> str:
    g = 1e9
    f = plan.flops
    lines = [f"plan for {name}: {gpus} GPU(s), train.parallel={cfg.train.parallel}, peak {peak:g} TFLOP/s, "
             f"MFU {mfu:.0%}",
             f"student parameters: {plan.params['total'] / 1e6:.1f}M",
             "model FLOPs per canvas token (GFLOP):"]
    for key in ("student_fwd_bwd", "self_cond_aux", "decoder_head", "frozen_encoder", "frozen_teacher", "total"):
        lines.append(f"  {key:<16} {f[key] / g:8.3f}  ({f[key] / f['total']:5.1%})")
    if f["recompute"]:
        lines.append(f"  {'recompute':<16} {f['recompute'] / g:8.3f}  (activation checkpointing; not in MFU)")
    lines.append("memory per GPU (GB):")
    for key, value in plan.memory.items():
        lines.append(f"  {key:<20} {value / 1e9:8.2f}")
    if plan.examples_per_epoch is not None:
        lines.append(f"tokens per epoch: {plan.examples_per_epoch:,} examples × {cfg.text.canvas_len} canvas = "
                     f"{plan.tokens_per_epoch / 1e9:.3f}B (padding included)")
    else:
        lines.append("tokens per epoch: unknown (pass --examples N, or use a local jsonl data.path)")
    lines.append(f"step: {plan.tokens_per_step:,} canvas tokens, {plan.step_seconds:.3f} s")
    lines.append(f"budget: {plan.steps:,} steps = {plan.steps * plan.step_seconds / 3600:.1f} h wall, "
                 f"{plan.gpu_hours:.1f} GPU-hours")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cfg = Config.load(args.config, args.override)
    peak = args.peak_tflops if args.peak_tflops is not None else cfg.train.peak_tflops
    plan = make_plan(cfg, args.gpus, peak, args.mfu, args.examples, args.epochs, args.teacher_tokens)
    print(format_plan(args.config, cfg, plan, args.gpus, peak, args.mfu))
    if args.compare:
        other_cfg = Config.load(args.compare, args.override)
        other = make_plan(other_cfg, args.gpus, peak, args.mfu, args.examples, args.epochs, args.teacher_tokens)
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
    p.add_argument("--mfu", type=float, default=DEFAULT_MFU, help=f"model FLOPs utilisation (default {DEFAULT_MFU})")
    p.add_argument("--examples", type=int, default=None, help="training examples per epoch (default: counted)")
    p.add_argument("--epochs", type=float, default=None, help="budget in epochs instead of train.steps")
    p.add_argument("--teacher-tokens", type=int, default=None,
                   help="positions the teacher runs per example: the longest content (prompt + answer) of a "
                        "micro-batch (default: the canvas length, an upper bound)")
    p.add_argument("--compare", default=None, help="another config: print the GPU-hour ratio")
    p.add_argument("override", nargs="*", help="key.sub=value overrides (applied to both configs)")
    p.set_defaults(func=run)
