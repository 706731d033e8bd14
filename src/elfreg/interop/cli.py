"""The interop room's commands: ``elfreg lm-eval`` (docs/interop.md) and ``elfreg import-elf``
(docs/elf.md).

``elfreg lm-eval``: an lm-evaluation-harness run of a checkpoint.

    elfreg lm-eval --checkpoint DIR --tasks T[,T2] [--include-path P] [--limit N]
                   [--model-args sampler=early-stop,nfe=64,sc_cfg=3,seed=0] [--out DIR]

Builds :class:`~elfreg.interop.lm_eval_adapter.ElfregLM` (``--model-args``: every sampler
setting and the adapter's keys, strictly checked before the checkpoint loads) and hands it to
``lm_eval.simple_evaluate`` with a task manager that also reads ``--include-path``. Prints
lm-eval's results table; ``--out`` writes ``results.json`` and one ``samples_TASK.jsonl`` per
task. Needs the ``lm-eval`` extra; without it the command fails with one line.

``elfreg import-elf``: an ELF checkpoint (a file, a folder of ``checkpoint_<step>`` files, or a Hub
repo) and its training YAML as an elfreg checkpoint (:mod:`elfreg.interop.elf_import`);
``--check`` runs a parity file made by ELF's own code through the imported student
(:mod:`elfreg.interop.elf_parity`) and exits 1 unless every case matches.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..jsonl import write_jsonl


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
            write_jsonl(out / f"samples_{task}.jsonl", rows, default=str)
        print(f"wrote {out / 'results.json'} and {len(samples)} samples file(s)")
    return 0


def import_elf_command(args: argparse.Namespace) -> int:
    from ..config import Config
    from .elf_import import import_elf
    from .elf_parity import check_parity
    from .elf_trace import check_traces, is_trace_file

    out, student = import_elf(args.checkpoint, args.elf_config, args.out, args.weights, args.override, args.revision)
    print(f"imported {args.weights} weights of {args.checkpoint} into {out} ({student.cfg.depth} blocks, width "
          f"{student.cfg.width}, {student.cfg.heads} heads, vocabulary {student.vocab_size})")
    failed = 0
    for path in args.check or []:
        if is_trace_file(path):
            results, what = check_traces(student, Config.load(out / "config.yaml").flow, path), "traces"
        else:
            results, what = check_parity(student, path), "cases"
        for result in results:
            print(result.line())
        bad = sum(not r.ok for r in results)
        print(f"parity with {path}: {len(results) - bad} of {len(results)} {what} within tolerance")
        failed += bad
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-elf", help="convert an ELF checkpoint into an elfreg checkpoint (docs/elf.md)",
                       description="Convert a checkpoint of ELF (arXiv 2605.10938, branch pytorch_elf) into an "
                                   "elfreg checkpoint that elfreg sample, eval and train.init_from read.")
    p.add_argument("--checkpoint", required=True,
                   help="an ELF checkpoint_<step> file, a folder of them (the newest), or a Hub repo id")
    p.add_argument("--elf-config", required=True, help="the model's ELF training YAML (encoder, latents, settings)")
    p.add_argument("--out", required=True, help="the elfreg checkpoint folder to create (must not exist)")
    p.add_argument("--weights", choices=("params", "ema"), default="ema",
                   help="which of ELF's weights to import (default: ema, what ELF samples with)")
    p.add_argument("--revision", help="Hub revision of --checkpoint")
    p.add_argument("--check", metavar="FILE.safetensors", action="append",
                   help="a parity file of ELF's forward or a trace of its sampler (tools/elf_reference.py; "
                        "repeatable): one line per case or trace, exit 1 unless every one is within "
                        "1e-4 x max(1, max |reference|)")
    p.add_argument("override", nargs="*", help="key.sub=value overrides of the written config, e.g. "
                                               "text.encoder=/local/t5-small")
    p.set_defaults(func=import_elf_command)

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
