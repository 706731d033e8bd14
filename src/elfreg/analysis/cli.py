"""``elfreg analyze trajectory``: Table 11 / Fig. 2 / Table 13 of the paper on a checkpoint.

    elfreg analyze trajectory --checkpoint RUN --task gsm8k --out DIR [--limit K] [--master 512]
        [--nfes 4,8,16,32,64] [--seeds 0,1] [--split test | --source FILE] [--acceleration 65]

One master trajectory per (problem, seed); the readouts at the NFEs are compared with its
endpoint (docs/analysis.md). Rows are appended to ``DIR/rows.jsonl`` as each batch is done; the
same command again resumes, skipping the pairs already there. ``DIR/analysis_config.json`` is
the folder's identity: another analysis into a used folder is refused with one line unless
``--overwrite`` (which removes only the files this command writes). The folder is locked while
the command runs; SIGINT/SIGTERM stops after the current batch (exit 130).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import open_checkpoint, resolve_checkpoint
from ..config import add_progress_flag, comma_list
from ..device import add_device_flags
from ..eval.tasks import Task, canonical_task_name, get_task
from ..jsonl import append_jsonl, drop_cut_last_line, read_jsonl, write_jsonl
from ..plugins import DATA_SOURCES, lookup, registered_names
from ..runs import FolderKind, GracefulInterrupt, claimed, write_json_atomic

if TYPE_CHECKING:
    from ..config import Config, SampleConfig
    from .measure import Plan

ROWS_NAME = "rows.jsonl"
PROBLEMS_NAME = "problems.jsonl"
#: ``analyze trajectory``'s folder: every file it writes (``--overwrite`` removes only these)
ANALYSIS_FOLDER = FolderKind(job="analysis", identity_file="analysis_config.json",
                             outputs=(ROWS_NAME, PROBLEMS_NAME, "table11.json", "table11.txt", "fig2.png",
                                      "analysis_config.json"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="analyses of a checkpoint's sampling (ELF-REG §4, App. C)",
                       description="Analyses the paper reports (ELF-REG §4, App. C).")
    inner = p.add_subparsers(dest="analysis", required=True)
    t = inner.add_parser("trajectory", help="Table 11 / Fig. 2: early-stopped readouts of one master trajectory",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--checkpoint", required=True, help="run folder, checkpoints folder or one checkpoint")
    t.add_argument("--task", required=True, help="the task whose prompts and answer checker are used (gsm8k, ...)")
    t.add_argument("--out", required=True, help="output folder (resumable)")
    t.add_argument("--limit", type=int, default=0, help="only the first K problems (0: all)")
    t.add_argument("--master", type=int, default=512, help="master budget M: the trajectory runs all M − 1 steps")
    t.add_argument("--nfes", type=comma_list(int), default=[4, 8, 16, 32, 64],
                   help="readout NFEs, comma-separated, each <= M (default 4,8,16,32,64)")
    t.add_argument("--seeds", type=comma_list(int), default=[0, 1],
                   help="sampling seeds, comma-separated (default 0,1)")
    t.add_argument("--flip-nfe", type=int, help="NFE of the paired flips (default 64, else the largest NFE < M)")
    t.add_argument("--observe-every", type=int, default=8,
                   help="also save every k-th NFE as an observation for stable tokens (0: only the NFEs)")
    t.add_argument("--acceleration", type=int, default=65, metavar="K",
                   help="uniform grid points of the acceleration / Prop. 1 run (0: skip it)")
    t.add_argument("--split", choices=("train", "valid", "test"),
                   help="problems from the checkpoint's own registered data source (the toy tasks) at this split, "
                        "in GSM8K's row format, instead of the benchmark")
    t.add_argument("--source", default="auto", help="benchmark data: auto, local, hub or a JSONL file")
    t.add_argument("--data-dir", help="benchmark data directory")
    t.add_argument("--sc-cfg", type=float, help="SC-CFG scale w (default: the checkpoint's sample.sc_cfg)")
    t.add_argument("--batch-size", type=int, default=8, help="problems per sampling batch")
    add_device_flags(t)
    t.add_argument("--overwrite", action="store_true", help="replace another analysis's files in --out")
    add_progress_flag(t)
    t.add_argument("--debug", action="store_true", help="show tracebacks")
    t.set_defaults(func=run_trajectory)


class AnalysisError(ValueError):
    """A one-line reason the analysis cannot run (bad input, a used folder)."""


class AnalysisStopped(RuntimeError):
    """SIGINT or SIGTERM stopped the analysis after a batch; the rows done are kept."""

    exit_status = 130


def _split_task(args: argparse.Namespace, trained: Config, name: str, folder: Path) -> Task:
    """The checkpoint's own data source at ``--split``, written to ``problems.jsonl`` as GSM8K rows."""
    loader = lookup(DATA_SOURCES, trained.data.source)
    data = dataclasses.replace(trained.data, split=args.split, toy_count=args.limit or trained.data.toy_count)
    rows = [{"question": ex.prompt, "answer": ex.answer} for ex in loader(data)]
    path = folder / PROBLEMS_NAME
    write_jsonl(path, rows)
    return get_task(name, source=str(path))


def run_trajectory(args: argparse.Namespace) -> int:
    from .measure import Plan, master_sample

    plan = Plan.make(args.master, args.nfes, args.observe_every, args.flip_nfe, args.acceleration)
    if not args.seeds or len(set(args.seeds)) != len(args.seeds) or args.limit < 0 or args.batch_size < 1:
        raise AnalysisError(f"--seeds needs distinct seeds (got {args.seeds}), --limit must be >= 0 and "
                            "--batch-size >= 1")
    ckpt = resolve_checkpoint(args.checkpoint)
    if ckpt is None:
        raise AnalysisError(f"no checkpoint at {args.checkpoint} (expected model.safetensors or checkpoints/latest)")
    ckpt = ckpt.resolve()
    trained = open_checkpoint(ckpt).config
    sample = trained.sample.replace(sc_cfg=args.sc_cfg)
    name = canonical_task_name(args.task)
    if args.split:
        if name != "gsm8k":
            raise AnalysisError("--split reads the checkpoint's data source in GSM8K's row format: use --task gsm8k")
        if lookup(DATA_SOURCES, trained.data.source) is None:
            raise AnalysisError(f"--split needs a checkpoint trained on a registered data source "
                                f"({', '.join(registered_names(DATA_SOURCES))}); its data.source is "
                                f"{trained.data.source!r}")
        task_id = {"task": name, "source": f"{trained.data.source}:{args.split}", "data": dataclasses.asdict(
            trained.data)}
    else:
        task = get_task(name, source=args.source, data_dir=args.data_dir)
        task.use_trained_template(trained.data.template)
        task_id = task.identity()
    identity = {"kind": "trajectory", "task": task_id, "checkpoint": str(ckpt), "master": plan.master,
                "nfes": list(plan.nfes), "observations": list(plan.observe), "flip_nfe": plan.flip_nfe,
                "acceleration": plan.uniform, "seeds": list(args.seeds), "limit": args.limit,
                "sample": dataclasses.asdict(master_sample(sample, plan.master)), "precision": args.precision}
    folder = Path(args.out)
    with claimed(folder, identity, ANALYSIS_FOLDER, overwrite=args.overwrite), GracefulInterrupt() as stop:
        if args.split:
            task = _split_task(args, trained, name, folder)
            task.use_trained_template(trained.data.template)
        problems = task.problems()[: args.limit] if args.limit else task.problems()
        if not problems:
            raise AnalysisError(f"the task {name} has no problems to analyse")
        rows = _run(args, plan, sample, ckpt, task, problems, folder, lambda: stop.requested)
        if rows is None:
            raise AnalysisStopped(f"stopped by {stop.signal_name or 'a signal'}; the rows done are saved in "
                                  f"{folder / ROWS_NAME}; run the same command again to resume")
        from ..sampling import load_checkpoint
        from .measure import head_lipschitz

        lipschitz = head_lipschitz(load_checkpoint(ckpt, args.device, args.precision))
        config = {**identity, "args": {k: v for k, v in vars(args).items() if k != "func"}}
        _report(rows, plan, config, folder, lipschitz)
    return 0


def _saved(path: Path, expected: set[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    if not path.exists():
        return {}
    drop_cut_last_line(path)
    done = {}
    for i, row in enumerate(read_jsonl(path), start=1):
        key = (row.get("task_id"), row.get("seed"))
        if key not in expected:
            raise AnalysisError(f"{path}:{i}: ({key[0]}, seed {key[1]}) is not part of this analysis")
        done[key] = row
    return done


def _run(args: argparse.Namespace, plan: Plan, sample: SampleConfig, ckpt: Path, task: Task,
         problems: list[dict[str, Any]], folder: Path, should_stop: Callable[[], bool]) -> list[dict[str, Any]] | None:
    """Every (problem, seed) row, computing and appending the missing ones; None when stopped."""
    from tqdm.auto import tqdm

    from ..sampling import load_checkpoint
    from .measure import measure_batch
    from .trajectory_metrics import answer_agreement

    path = folder / ROWS_NAME
    expected = [(p["task_id"], s) for p in problems for s in args.seeds]
    done = _saved(path, set(expected))
    todo = [(i, s) for i, p in enumerate(problems) for s in args.seeds if (p["task_id"], s) not in done]
    bar = tqdm(total=len(expected), initial=len(expected) - len(todo), desc="trajectory", unit="pair",
               disable=True if args.no_progress else None, dynamic_ncols=True)
    try:
        if todo:
            models = load_checkpoint(ckpt, args.device, args.precision)
        for seed in args.seeds:
            mine = [i for i, s in todo if s == seed]
            for start in range(0, len(mine), args.batch_size):
                if should_stop():
                    return None
                batch = [problems[i] for i in mine[start:start + args.batch_size]]
                rows = measure_batch(models, [task.prompt(p) for p in batch], seed, plan, sample,
                                     batch_size=args.batch_size, precision=args.precision)
                cells = [(p, r["nfe"][str(n)]) for p, r in zip(batch, rows, strict=True) for n in plan.reported]
                for (_, cell), v in zip(cells, task.check_many([(p, c["text"], "solution") for p, c in cells]),
                                        strict=True):
                    cell["correct"], cell["extracted"] = bool(v.passed), v.extracted
                for p, r in zip(batch, rows, strict=True):
                    end = r["nfe"][str(plan.master)]
                    for cell in r["nfe"].values():
                        cell["answer_agree"] = answer_agreement(cell["extracted"], end["extracted"])
                    r["endpoint"].update(correct=end["correct"], extracted=end["extracted"])
                    row = {"task_id": p["task_id"], "seed": seed, **r}
                    append_jsonl(path, row)
                    done[(p["task_id"], seed)] = row
                bar.update(len(batch))
    finally:
        bar.close()
    return [done[key] for key in expected]


def _report(rows: list[dict[str, Any]], plan: Plan, config: dict[str, Any], folder: Path, lipschitz: float) -> None:
    from .report import format_table, plot, summarize

    summary = summarize(rows, plan, lipschitz, config)
    write_json_atomic(folder / "table11.json", summary)
    table = format_table(summary)
    (folder / "table11.txt").write_text(table, encoding="utf-8")
    if rows:
        plot(summary, folder / "fig2.png")
    print(table, end="")
    print(f"results written to {folder.resolve()}")
