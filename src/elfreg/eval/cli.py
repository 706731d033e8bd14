"""The ``elfreg eval`` subcommand.

Examples::

    elfreg eval --task gsm8k --checkpoint runs/gsm8k --samples 16 --nfe 64 --sampler early-stop --out out/
    elfreg eval --task humaneval --predictions samples.jsonl --out out/
    elfreg eval --task humaneval+ --predictions samples.jsonl --workers 8 --limit 20
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["register", "build_parser", "run"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=False, help="gsm8k, math500, mmlu, humaneval, humaneval+, mbpp, mbpp+")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--predictions", metavar="FILE.jsonl",
                      help="score existing outputs (task_id + completion or solution per line)")
    what.add_argument("--checkpoint", metavar="DIR", help="generate outputs from this checkpoint, then score them")
    p.add_argument("--samples", type=int, default=16, help="samples per problem when generating (default 16)")
    p.add_argument("--nfe", type=int, default=64, help="network evaluations per sample when generating (default 64)")
    p.add_argument("--sampler", default="early-stop", help="sampler name passed to the sampling API")
    p.add_argument("--seed", type=int, default=0, help="seed of sample 0; sample j uses seed + j")
    p.add_argument("--out", metavar="DIR", help="write samples.jsonl, summary.json and table.txt here")
    p.add_argument("--data-dir", metavar="DIR", help="benchmark data directory (default: $ELFREG_DATA_DIR or "
                   "../shared/data)")
    p.add_argument("--source", default="auto",
                   help="auto (local copy, else Hugging Face Hub), local, hub, or a JSONL file path")
    p.add_argument("--workers", type=int, default=None, help="parallel sandboxes (default: CPU count)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per assert test suite (default 10)")
    p.add_argument("--plus-timeout", type=float, default=60.0,
                   help="cap in seconds on one program's extended tests (default 60)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N problems")
    p.add_argument("--no-alias", action="store_true",
                   help="headline score without the alias option (both are always reported)")
    p.add_argument("--plus-limit", type=int, default=None, metavar="N",
                   help="HumanEval+/MBPP+: only the first N plus inputs per problem (quick runs)")
    p.add_argument("--template", default=None, help="prompt template (str.format fields of the task)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--list-tasks", action="store_true", help="list the tasks and exit")


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
    try:
        task_name = canonical_task_name(args.task)
    except ValueError as err:
        print(f"elfreg eval: error: {err}", file=sys.stderr)
        return 2
    if not args.predictions and not args.checkpoint:
        print("elfreg eval: error: give --predictions FILE or --checkpoint DIR", file=sys.stderr)
        return 2
    for flag, value in (("--workers", args.workers), ("--limit", args.limit), ("--samples", args.samples),
                        ("--nfe", args.nfe), ("--plus-limit", args.plus_limit)):
        if value is not None and value < 1:
            print(f"elfreg eval: error: {flag} must be at least 1", file=sys.stderr)
            return 2
    options: dict[str, Any] = {"data_dir": args.data_dir, "source": args.source}
    if args.template is not None:
        options["template"] = args.template
    if task_name in ("humaneval+", "mbpp+") and args.plus_limit is not None:
        options["plus_limit"] = args.plus_limit
    common = dict(
        workers=args.workers, timeout=args.timeout, io_timeout=args.plus_timeout, alias=not args.no_alias,
        limit=args.limit, progress=not args.no_progress, out_dir=args.out, task_options=options,
    )
    try:
        if args.predictions:
            report = score_predictions(task_name, args.predictions, **common)
        else:
            report = evaluate_checkpoint(
                task_name, args.checkpoint, samples=args.samples, nfe=args.nfe, sampler=args.sampler,
                seed=args.seed, **common,
            )
    except (PredictionError, EvalError, DataUnavailable) as err:
        print(f"elfreg eval: error: {err}", file=sys.stderr)
        return 2
    print(report.table, end="")
    if args.out:
        print(f"results written to {os.path.abspath(args.out)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    _args = build_parser().parse_args()
    raise SystemExit(_args.func(_args))
