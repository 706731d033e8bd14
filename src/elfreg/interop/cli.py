"""``elfreg lm-eval``: an lm-evaluation-harness run of a checkpoint (docs/interop.md).

    elfreg lm-eval --checkpoint DIR --tasks T[,T2] [--include-path P] [--limit N]
                   [--model-args sampler=early-stop,nfe=64,sc_cfg=3,seed=0] [--out DIR]

Builds :class:`~elfreg.interop.lm_eval_adapter.ElfregLM` (``--model-args``: every sampler
setting and the adapter's keys, strictly checked before the checkpoint loads) and hands it to
``lm_eval.simple_evaluate`` with a task manager that also reads ``--include-path``. Prints
lm-eval's results table; ``--out`` writes ``results.json`` and one ``samples_TASK.jsonl`` per
task. Needs the ``lm-eval`` extra; without it the command fails with one line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _limit(text: str) -> int | float:
    """``--limit``: an integer count of documents per task, or a fraction below 1."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return int(value) if value >= 1 and value == int(value) else value


def evaluate(checkpoint: str, tasks: list[str], include_path: str | None = None, limit: int | float | None = None,
             model_args: str = "", log_samples: bool = False) -> dict[str, Any]:
    """lm-eval's results dict for ``tasks`` answered by the checkpoint (see the module docstring)."""
    from .lm_eval_adapter import ElfregLM, parse_model_args, require_lm_eval, split_model_args

    require_lm_eval()
    args = parse_model_args(model_args)
    if "checkpoint" in args:
        raise ValueError("give the checkpoint with --checkpoint, not in --model-args")
    split_model_args(args)  # bad keys fail before anything loads
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path)
    missing = [t for t in tasks if t not in manager.all_tasks]
    if missing:
        where = f" (with --include-path {include_path})" if include_path else " (add --include-path for local tasks)"
        raise ValueError(f"unknown lm-eval task(s) {', '.join(missing)}{where}")
    model = ElfregLM(checkpoint=checkpoint, **args)
    results = lm_eval.simple_evaluate(model=model, tasks=tasks, limit=limit, task_manager=manager,
                                      log_samples=log_samples, bootstrap_iters=0)
    if results is None:
        raise RuntimeError("lm-eval returned no results")
    return results


def run(args: argparse.Namespace) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError("--tasks: give at least one task name")
    results = evaluate(args.checkpoint, tasks, args.include_path, args.limit, args.model_args or "",
                       log_samples=bool(args.out))
    from lm_eval.utils import make_table

    samples = results.pop("samples", {})
    print(make_table(results))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str, ensure_ascii=False) + "\n")
        for task, rows in samples.items():
            with open(out / f"samples_{task}.jsonl", "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, default=str, ensure_ascii=False) + "\n")
        print(f"wrote {out / 'results.json'} and {len(samples)} samples file(s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lm-eval", help="evaluate a checkpoint with lm-evaluation-harness (generative tasks)",
                       description="Run lm-evaluation-harness tasks (generate_until only) on an ELF-REG "
                                   "checkpoint. Needs: pip install 'elfreg[lm-eval]'.")
    p.add_argument("--checkpoint", required=True, help="run folder, checkpoints folder or one checkpoint")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--include-path", help="folder of extra lm-eval task YAML files")
    p.add_argument("--limit", type=_limit, help="documents per task: a count, or a fraction below 1")
    p.add_argument("--model-args", default="",
                   help="key=value,... : any sampler setting (sampler, nfe, sc_cfg, ...) and seed, batch_size, "
                        "device, precision, raw_weights, progress")
    p.add_argument("--out", help="write results.json and samples_TASK.jsonl here")
    p.set_defaults(func=run)
