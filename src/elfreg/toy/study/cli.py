"""``elfreg study --plan FILE.yaml [--out DIR] [--dry-run | --report | --report-to DIR] [--compare A B ...]
[--overwrite] [--adopt CELL RUN_DIR ...] [key=value ...]``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from elfreg.config import add_progress_flag
from elfreg.toy.study.plan import Study, load_plan


def _value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def format_status(study: Study, status: dict) -> str:
    """What ``--dry-run`` prints: the models and samplers as resolved, and each training cell
    with its evaluation cells done / planned in the out folder."""
    lines = [f"plan {status['identity']} into {status['out']}"]
    if status["clashes"]:
        lines.append(f"  the folder holds models trained with other settings ({'; '.join(status['clashes'])}): "
                     "running refuses it unless --overwrite")
    elif status["held_identity"] not in (None, status["identity"]):
        lines.append(f"  the folder holds the cells of plan {status['held_identity']}: this plan keeps them and "
                     "adds its own")
    lines.append("models (changes to the base config):")
    for name, changes in study.model_changes.items():
        text = ", ".join(f"{k}={_value(v)}" for k, v in changes.items()) or "the base as it is"
        lines.append(f"  {name}: {text}")
    lines.append("samplers (changes to the sample section):")
    for name, changes in study.sampler_changes.items():
        lines.append(f"  {name}: {', '.join(f'{k}={_value(v)}' for k, v in changes.items())}")
    p = study.plan
    lines.append(f"train seeds {p.train_seeds}; NFE {p.nfes}; sampling seeds {p.sample_seeds}")
    if study.distill is not None:
        lines.append(f"distilled: {', '.join(p.distill.models)} into {', '.join(map(str, study.distill_steps))}-step "
                     f"students, each beside its teacher at N + 1 NFE with {', '.join(study.distill_samplers)}")
    total = sum(c["eval_cells"] for c in status["training"])
    done = sum(c["eval_done"] for c in status["training"])
    trained = sum(c["trained"] for c in status["training"])
    lines.append(f"training cells: {len(status['training'])} ({trained} trained); "
                 f"evaluation cells: {total} ({done} done)")
    for c in status["training"]:
        distilled = f"; distilled {c['distilled_done']}/{c['distilled_cells']}" if c["distilled_cells"] else ""
        lines.append(f"  {c['cell']:<20} {'trained' if c['trained'] else 'to train':<9} "
                     f"evaluations {c['eval_done']}/{c['eval_cells']}{distilled}")
    return "\n".join(lines)


def default_out(plan: str) -> Path:
    """``runs/<plan name>``, with ``study-`` in front unless the name starts with it
    (``configs/study-toy-level1.yaml`` → ``runs/study-toy-level1``)."""
    stem = Path(plan).stem
    return Path("runs") / (stem if stem.startswith("study") else f"study-{stem}")


def run(args: argparse.Namespace) -> int:
    from elfreg.toy.study.compare import compare_arms, format_comparison, parse_arm
    from elfreg.toy.study.report import format_table, write_outputs
    from elfreg.toy.study.runner import adopt_run, report_so_far, run_study, status

    study = load_plan(args.plan, args.override)
    out = Path(args.out or default_out(args.plan))
    if args.adopt:
        for cell, source in args.adopt:
            print(f"{cell}: adopted {source} as {adopt_run(study, out, cell, source)}")
    if args.dry_run or args.adopt:
        print(format_status(study, status(study, out)))
        return 0
    arms = [(parse_arm(a, study), parse_arm(b, study)) for a, b in args.compare or []]
    if args.report or args.report_to or arms:
        report = report_so_far(study, out)
        if not report["rows"]:
            print(f"no evaluation cell of plan {study.identity()} has finished in {out} yet")
            return 0
        comparisons = [compare_arms(report["rows"], a, b) for a, b in arms]
        if args.report or args.report_to:
            done = sum(e["cells"] for e in report["table"] + report.get("distilled", []))
            print(format_table(report))
            print(f"\n{done} of {len(study.eval_cells()) + len(study.distilled_cells())} evaluation cells finished"
                  + ("" if report["complete"] else "; rows marked (incomplete) miss cells"))
        for c in comparisons:
            print("\n" + format_comparison(c))
        if args.report_to:
            folder = Path(args.report_to)
            if folder.resolve() == out.resolve():
                raise ValueError("--report-to must be another folder than --out (a study may be running there)")
            folder.mkdir(parents=True, exist_ok=True)
            written = write_outputs(folder, report)
            if comparisons:
                written.append(folder / "comparisons.json")
                written[-1].write_text(json.dumps(comparisons, indent=2) + "\n")
            print(f"wrote {', '.join(str(p) for p in written)}")
        return 0
    report = run_study(study, out, overwrite=args.overwrite, progress=not args.no_progress, jobs=args.jobs)
    print(format_table(report))
    print(f"\nwrote {', '.join(report['outputs'])} ({report['run_seconds']:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="a resumable grid of toy trainings and evaluations (models × seeds × "
                                     "samplers × NFE) with one results table")
    p.add_argument("--plan", required=True, help="the study plan (e.g. configs/study-toy-level1.yaml)")
    p.add_argument("--out", help="output folder (default runs/<plan name>, study- put in front unless it starts so)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the cells and what is done; run nothing")
    mode.add_argument("--report", action="store_true",
                      help="print the table of the cells finished so far (also while a study runs); run nothing")
    mode.add_argument("--report-to", metavar="DIR",
                      help="as --report, and write its results.json, table.md and plot into DIR")
    p.add_argument("--compare", nargs=2, action="append", metavar=("A", "B"),
                   help="A − B per training run over the cells both share; an arm is a model (elf-reg) or a "
                        "model/sampler (elf-reg/renoise); repeatable; alone it runs nothing and prints only these")
    mode.add_argument("--adopt", nargs=2, action="append", metavar=("CELL", "RUN_DIR"),
                      help="copy a training run made outside the study (elfreg demo --seeds S) in as the training "
                           "cell CELL (elf-reg/t1) after checking it was trained as the plan trains it; repeatable; "
                           "runs nothing else")
    p.add_argument("--overwrite", action="store_true",
                   help="discard what another plan made in --out (its runs included) instead of refusing")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="training cells run N at a time, each in its own process on 1/N of torch's threads "
                        "(a toy cell keeps about one core busy); rows and folders as with one")
    add_progress_flag(p)
    p.add_argument("override", nargs="*", help="plan overrides, e.g. train_seeds=[0] overrides.train.steps=50")
    p.set_defaults(func=run)
