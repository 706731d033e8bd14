"""The ``elfreg eval`` subcommand.

Examples::

    elfreg eval --task gsm8k --checkpoint runs/gsm8k --samples 16 --nfe 64 --sampler early-stop --out out/
    elfreg eval --task gsm8k --checkpoint runs/gsm8k --nfes 16 64 128 --out out/   # one folder per NFE
    elfreg eval --task humaneval --predictions samples.jsonl --out out/
    elfreg eval --task humaneval+ --predictions samples.jsonl --workers 8 --limit 20

Evaluation settings are the fields of ``EvalConfig`` and sampler settings those of
``SampleConfig`` (``elfreg.config``), each a flag of the same name; unset sampler settings come
from the checkpoint's config.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from ..config import ConfigError, EvalConfig, SampleConfig, add_config_flags, config_flag_values
from ..device import PRECISIONS

__all__ = ["register", "build_parser", "run"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=False, help="gsm8k, math500, mmlu, humaneval, humaneval+, mbpp, mbpp+")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--predictions", metavar="FILE.jsonl",
                      help="score existing outputs (task_id + completion or solution per line)")
    what.add_argument("--checkpoint", metavar="DIR", help="generate outputs from this checkpoint, then score them")
    p.add_argument("--out", metavar="DIR", help="write samples.jsonl, summary.json and table.txt here")
    p.add_argument("--device", default="auto", help="generation device (default: CUDA when available)")
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--list-tasks", action="store_true", help="list the tasks and exit")
    add_config_flags(p, EvalConfig, "evaluation settings (eval.* of a config)")
    add_config_flags(p, SampleConfig, "sampler settings (sample.*; default: the checkpoint's)")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "eval",
        help="evaluate on a benchmark (generate from a checkpoint or score predictions)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser (``python -m elfreg.eval.cli``)."""
    parser = argparse.ArgumentParser(prog="elfreg")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def run(args: argparse.Namespace) -> int:
    """Handler of ``elfreg eval``; returns the exit status."""
    from .generation import EvalError, evaluate_checkpoint
    from .predictions import PredictionError
    from .scoring import score_predictions
    from .sources import DataUnavailable
    from .tasks import TASKS, canonical_task_name

    if args.list_tasks:
        for name, cls in TASKS.items():
            print(f"{name:12s} {cls.id_pattern}")
        return 0
    if not args.task:
        print("elfreg eval: error: --task is required (see --list-tasks)", file=sys.stderr)
        return 2
    if not args.predictions and not args.checkpoint:
        print("elfreg eval: error: give --predictions FILE or --checkpoint DIR", file=sys.stderr)
        return 2
    try:
        task_name = canonical_task_name(args.task)
        ev = EvalConfig(**config_flag_values(args, EvalConfig)).validate()
        overrides = config_flag_values(args, SampleConfig)
        SampleConfig().replace(**overrides)  # checks the given sampler settings before any work
    except (ConfigError, ValueError) as err:
        print(err if isinstance(err, ConfigError) else f"elfreg eval: error: {err}", file=sys.stderr)
        return 2
    options = {"data_dir": ev.data_dir, "source": ev.source,
               **({"template": ev.template} if ev.template is not None else {}),
               **({"plus_limit": ev.plus_limit} if task_name in ("humaneval+", "mbpp+") and ev.plus_limit else {})}
    common = dict(workers=ev.workers or None, timeout=ev.timeout, io_timeout=ev.plus_timeout, alias=ev.alias,
                  limit=ev.limit or None, progress=not args.no_progress, task_options=options)
    # an NFE / sampler sweep: every pair, each into its own folder
    points = [{}] if not (ev.nfes or ev.samplers) else [
        {k: v for k, v in (("sampler", s), ("nfe", n)) if v is not None}
        for s in ev.samplers or [overrides.get("sampler")] for n in ev.nfes or [overrides.get("nfe")]]
    try:
        for point in points:
            out = args.out
            if args.out and len(points) > 1:
                out = str(Path(args.out) / "-".join(f"{k}{v}" if k == "nfe" else str(v) for k, v in point.items()))
            if args.predictions:
                report = score_predictions(task_name, args.predictions, out_dir=out, **common)
            else:
                report = evaluate_checkpoint(
                    task_name, args.checkpoint, sample_overrides={**overrides, **point}, samples=ev.samples,
                    seed=ev.seed, batch_size=ev.batch_size, device=args.device, precision=args.precision,
                    out_dir=out, config={"eval": dataclasses.asdict(ev)}, **common)
            if len(points) > 1:
                print(f"== {', '.join(f'{k} {v}' for k, v in point.items())}")
            print(report.table, end="")
            if out:
                print(f"results written to {os.path.abspath(out)}")
    except (PredictionError, EvalError, DataUnavailable) as err:
        print(f"elfreg eval: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    _args = build_parser().parse_args()
    raise SystemExit(_args.func(_args))
