"""The ``elfreg eval`` subcommand.

Examples::

    elfreg eval --task gsm8k --checkpoint runs/gsm8k --samples 16 --nfe 64 --sampler early-stop --out out/
    elfreg eval --task gsm8k --checkpoint runs/gsm8k --nfes 16,64,128 --out out/   # one folder per NFE
    elfreg eval --task humaneval --predictions samples.jsonl --out out/
    elfreg eval --task humaneval+ --predictions samples.jsonl --workers 8 --limit 20
    torchrun --nproc_per_node 4 --no-python elfreg eval --task gsm8k --checkpoint runs/gsm8k --out out/

Evaluation settings are the fields of ``EvalConfig`` and sampler settings those of
``SampleConfig`` (``elfreg.config``), each a flag of the same name; unset sampler settings come
from the checkpoint's config.

Generated records are appended to ``--out``/predictions.jsonl as they are made; running the same
command again resumes (``eval_config.json`` is the folder's identity; a different evaluation
into a used folder is refused unless ``--overwrite``). SIGINT/SIGTERM stops at the next safe
point (exit 130); a second signal stops at once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import EvalConfig, SampleConfig, add_config_flags, add_progress_flag, config_flag_values
from ..device import add_device_flags
from ..host_memory import add_host_memory_flag, apply_host_memory
from ..runs import GracefulInterrupt
from ..sampling.cli import add_sampling_flags, sample_overrides
from .reporting import EvalStopped, held

__all__ = ["register", "run"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=False, help="gsm8k, math500, mmlu, humaneval, humaneval+, mbpp, mbpp+; "
                                                  "ELF's xsum, wmt14-de-en, owt-genppl")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--predictions", metavar="FILE.jsonl",
                      help="score existing outputs (task_id + completion or solution per line)")
    what.add_argument("--checkpoint", metavar="DIR", help="generate outputs from this checkpoint, then score them")
    p.add_argument("--out", metavar="DIR", help="write predictions, samples.jsonl, summary.json and table.txt here; "
                   "a rerun of the same evaluation into it resumes")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results of a different evaluation in --out (only the files elfreg wrote)")
    add_device_flags(p)
    add_progress_flag(p)
    p.add_argument("--list-tasks", action="store_true", help="list the tasks and exit")
    add_host_memory_flag(p)
    add_config_flags(p, EvalConfig, "evaluation settings (eval.* of a config)")
    add_sampling_flags(p)


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


def run(args: argparse.Namespace) -> int:
    """Handler of ``elfreg eval``; returns 0. Failures are exceptions that the ``elfreg`` command
    turns into one line (exit 2 on bad input or an unusable folder, 130 when stopped by
    SIGINT/SIGTERM at a safe point)."""
    from ..distributed import env_dist
    from .tasks import TASKS, canonical_task_name

    if args.list_tasks:
        for name, cls in TASKS.items():
            print(f"{name:12s} {cls.id_pattern}")
        return 0
    if not args.task:
        raise ValueError("--task is required (see --list-tasks)")
    if not args.predictions and not args.checkpoint:
        raise ValueError("give --predictions FILE or --checkpoint DIR")
    task_name = canonical_task_name(args.task)
    ev = EvalConfig(**config_flag_values(args, EvalConfig)).validate()
    overrides = sample_overrides(args)
    SampleConfig().replace(**overrides)  # checks the given sampler settings before any work
    ranks = env_dist()
    if ranks.world > 1 and not args.checkpoint and not ranks.is_main:
        return 0  # scoring --predictions is not sharded: rank 0 does it alone (in parallel sandboxes)
    if args.checkpoint:
        apply_host_memory(args.host_memory)
    if args.checkpoint and ranks.world > 1:
        # under torchrun: rank 0 evaluates, every rank generates (elfreg.eval.rank_pool)
        from . import generation
        from .rank_pool import finish, pool, serve, start

        def job(spec: tuple) -> Any:
            return generation._generate(*spec)

        try:
            if start() != 0:
                serve(job)
                return 0
            with pool(job) as rank_pool:
                _stoppable(args, task_name, ev, overrides, rank_pool)
        finally:
            finish()
        return 0
    _stoppable(args, task_name, ev, overrides, None)
    return 0


def _stoppable(args: argparse.Namespace, task_name: str, ev: EvalConfig, overrides: dict[str, Any],
               ranks: Any) -> None:
    """:func:`_evaluate` with the first SIGINT/SIGTERM turned into a stop at the next safe point
    (:class:`EvalStopped`, naming the signal) and a second into a stop at once."""
    with GracefulInterrupt() as stop:
        try:
            _evaluate(args, task_name, ev, overrides, lambda: stop.requested, ranks)
        except EvalStopped as err:
            raise EvalStopped(f"stopped by {stop.signal_name or 'a signal'}: {err}") from None
        except KeyboardInterrupt:  # the second signal: out at once
            raise EvalStopped("interrupted at once; every record written before stays, and running the same "
                              "command again resumes") from None


def _evaluate(args: argparse.Namespace, task_name: str, ev: EvalConfig, overrides: dict[str, Any],
              should_stop: Callable[[], bool], ranks: Any = None) -> None:
    """Every point of the run (one, or each (sampler, NFE) pair of a sweep into its own subfolder)."""
    from .generation import evaluate_checkpoint, require_checkpoint
    from .scoring import evaluate_predictions

    options = {"data_dir": ev.data_dir, "source": ev.source,
               **({"template": ev.template} if ev.template is not None else {}),
               **({"plus_limit": ev.plus_limit} if task_name in ("humaneval+", "mbpp+") and ev.plus_limit else {}),
               **({"ppl_model": ev.ppl_model, "ppl_batch_size": ev.ppl_batch_size, "device": args.device}
                  if task_name == "owt-genppl" else {})}
    common = dict(workers=ev.workers or None, timeout=ev.timeout, io_timeout=ev.plus_timeout, alias=ev.alias,
                  limit=ev.limit or None, progress=not args.no_progress, task_options=options,
                  should_stop=should_stop)
    # an NFE / sampler sweep: every pair, each into its own folder
    points = ev.points(overrides.get("sampler"), overrides.get("nfe"))
    sweep = len(points) > 1
    if args.checkpoint:
        require_checkpoint(args.checkpoint)  # before any folder is made or data loaded
    # a sweep holds its parent folder for the whole run; each point then claims its own subfolder
    with held(args.out, overwrite=args.overwrite) if sweep else contextlib.nullcontext():
        for i, point in enumerate(points):
            out = args.out
            if args.out and sweep:
                out = str(Path(args.out) / "-".join(f"{k}{v}" if k == "nfe" else str(v) for k, v in point.items()))
            overwrite = args.overwrite and not sweep
            if args.predictions:
                report = evaluate_predictions(task_name, args.predictions, out_dir=out, overwrite=overwrite, **common)
            else:
                report = evaluate_checkpoint(
                    task_name, args.checkpoint, sample_overrides={**overrides, **point}, samples=ev.samples,
                    seed=ev.seed, batch_size=ev.batch_size, device=args.device, precision=args.precision,
                    out_dir=out, overwrite=overwrite, config={"eval": dataclasses.asdict(ev)}, ranks=ranks,
                    **common)
            summary = report.summary
            if not summary["complete"]:
                where = f"a partial summary (complete: false) is in {Path(out) / 'summary.json'}" if out else \
                    "nothing was written (no --out)"
                raise EvalStopped(f"scoring stopped: {summary['n_samples']} of "
                                  f"{summary['n_samples'] + summary['n_not_scored']} samples scored; {where}; "
                                  "run the same command again to score them all")
            if sweep:
                print(f"== {', '.join(f'{k} {v}' for k, v in point.items())}")
            print(report.table, end="")
            if out:
                print(f"results written to {os.path.abspath(out)}")
            if should_stop() and i + 1 < len(points):
                raise EvalStopped(f"{i + 1} of {len(points)} sweep points are done; "
                                  "run the same command again to do the rest")

