"""The toy demo's student (or one of another width and depth) for benchmarks of its optimiser:
the command line and the model it describes."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from elfreg.config import Config
from elfreg.model.presets import student_from_config
from elfreg.model.student import Student
from elfreg.toy.assets import DEFAULT_ENCODER, DEFAULT_TEACHER
from elfreg.toy.demo import demo_config
from elfreg.toy.tokenizer import DEFAULT_VOCAB_SIZE

from perf.common import before_after_rows, print_before_after, write_report


def parse_flags(doc: str, repeats: int, extra: list[tuple[str, dict]] = ()) -> argparse.Namespace:
    """The command line of a benchmark of the demo's student: ``--width``, ``--depth``,
    ``--repeats`` (default ``repeats``), ``--out`` (a JSON report) and the script's own
    ``extra`` flags (name, ``add_argument`` keywords), with ``doc`` as its help."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, help="student width (default: the demo's)")
    p.add_argument("--depth", type=int, help="student depth (default: the demo's)")
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    for name, options in extra:
        p.add_argument(name, **options)
    return p.parse_args()


def demo_student(args: argparse.Namespace, seed: int = 0) -> tuple[Config, Student]:
    """The demo's config with ``args.width``/``args.depth`` (the REPA projector twice the width,
    as the demo's), and a student of it with the toy LMs' widths, initialised from ``seed``."""
    overrides = [f"model.{k}={v}" for k, v in (("width", args.width), ("depth", args.depth)) if v is not None]
    if args.width is not None:
        overrides.append(f"model.projector_hidden={2 * args.width}")
    cfg = demo_config(overrides=overrides)
    torch.manual_seed(seed)
    return cfg, student_from_config(cfg, DEFAULT_ENCODER.hidden_size, DEFAULT_VOCAB_SIZE, DEFAULT_TEACHER.hidden_size)


def report(args: argparse.Namespace, cfg: Config, seconds: dict[str, float], before: str, header: str,
           result: str, max_abs_difference: float, **extra: object) -> int:
    """Print and (with ``--out``) write a before/after run on the demo's student: ``header``
    after the student's shape, the cases against case ``before``, then ``result``. Exit status:
    1 when the two computed results differ by more than float rounding (1e-5), else 0."""
    rows = before_after_rows(seconds, before)
    print(f"student {cfg.model.width} x {cfg.model.depth}: {header}, threads: {torch.get_num_threads()}, "
          f"median of {args.repeats} rounds")
    print_before_after(rows)
    print(f"  {result}")
    if args.out:
        write_report(args.out, {"width": cfg.model.width, "depth": cfg.model.depth, "repeats": args.repeats},
                     rows, max_abs_difference=max_abs_difference, **extra)
    return 0 if max_abs_difference <= 1e-5 else 1
