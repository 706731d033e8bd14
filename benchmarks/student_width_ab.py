"""Training steps of the toy demo's ELF-REG student at several widths or batch sizes, measured side
by side: what a narrower student saves per step, to set how many more steps it can take in the
demo's time, or what a larger batch costs per example (a step's optimiser and per-call overheads
do not grow with the batch).

Each width is its own run of the demo's config (``model.width`` and ``model.projector_hidden`` =
2 × width changed, everything else as the demo trains it); with ``--batch-sizes`` each case is
instead the demo's width at one ``train.batch_size``. The frozen features of every batch to
come are computed beforehand, so only the student's step (forward, backward, ELF's Muon, EMA) is
timed. The runs step in turns (which goes first alternates) and each reports the median of its
steps and its speed-up over the first width or batch size given (below 1: slower). With ``--phase-steps N``
each width then takes N more steps under the profiler, and reports the mean time of
each labelled part of a step (``elfreg.train.step.PHASES``: forward, backward, optimiser, EMA;
``other`` is the rest of the profiled step: the batch, the random draws, the logged values). The
profiler adds its own overhead to every operator, so the parts are shares of a profiled step:
compare them across widths, not with the unprofiled seconds.

    python benchmarks/student_width_ab.py --widths 96 80 64 --repeats 40
    python benchmarks/student_width_ab.py --widths 80 72 64 --repeats 40 --phase-steps 20
    python benchmarks/student_width_ab.py --quick --widths 32 24 --repeats 2 --out width.json
    python benchmarks/student_width_ab.py --batch-sizes 32 16 48 64 --repeats 40

The toy LMs come from the demo's cache (``$ELFREG_CACHE``), built there first when missing. The
epoch of the feature cache's misses (the frozen encoder and teacher on each new batch) is not
timed here and does not depend on the width.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from elfreg.toy.demo import demo_config, variant_config
from elfreg.train.build import Run, start_run
from elfreg.train.step import PHASES, micro_batch, train_step

from perf.common import before_after_rows, print_before_after, timed, write_report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    axis = p.add_mutually_exclusive_group()
    axis.add_argument("--widths", type=int, nargs="+", help="student widths; the first is the base "
                      "(default 96 80 64)")
    axis.add_argument("--batch-sizes", type=int, nargs="+",
                      help="batch sizes at the demo's width instead; the first is the base")
    p.add_argument("--repeats", type=int, default=40, help="timed steps of each case")
    p.add_argument("--phase-steps", type=int, default=0,
                   help="then profile this many more steps of each case and time a step's parts")
    p.add_argument("--quick", action="store_true", help="the quick demo's run (its toy LMs build in a minute)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    if args.batch_sizes:
        cases = {f"batch {b}": [f"train.batch_size={b}"] for b in args.batch_sizes}
    else:
        args.widths = args.widths or [96, 80, 64]
        cases = {f"width {w}": [f"model.width={w}", f"model.projector_hidden={2 * w}"] for w in args.widths}
    if len(cases) != len(args.batch_sizes or args.widths):
        p.error("the widths or batch sizes must differ")
    if args.repeats < 1 or args.phase_steps < 0:
        p.error("--repeats must be at least 1 and --phase-steps at least 0")
    steps = args.repeats + 1 + args.phase_steps
    runs, params = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, overrides) in enumerate(cases.items()):
            base = demo_config(quick=args.quick, overrides=overrides)
            run, _ = start_run(variant_config(base, "elf-reg", Path(tmp) / str(k), progress=False), None,
                               resume_existing=False)
            for i in range(steps):  # frozen features of every batch to come, untimed
                micro_batch(run, i)
            runs[name], params[name] = run, sum(q.numel() for q in run.student.parameters())
        times: dict[str, list[float]] = {name: [] for name in cases}
        for step in range(args.repeats + 1):  # the first round warms up, untimed
            for name in list(cases)[::1 if step % 2 else -1]:
                seconds = timed(lambda n=name, s=step: train_step(runs[n], s), torch.device("cpu"))
                if step:
                    times[name].append(seconds)
        phases = {n: profiled_phases(runs[n], range(args.repeats + 1, steps)) for n in cases} \
            if args.phase_steps else {}
    base = next(iter(cases))
    rows = before_after_rows({n: statistics.median(times[n]) for n in cases}, base)
    for row in rows:
        cfg = runs[row["case"]].cfg
        row.update(width=cfg.model.width, batch=cfg.train.batch_size, params=params[row["case"]],
                   ms_per_example=1e3 * row["seconds"] / cfg.train.batch_size)
        if phases:
            row["phases_ms"] = phases[row["case"]]
    print(f"demo student x {runs[base].cfg.model.depth} blocks, threads: {torch.get_num_threads()}, "
          f"median of {args.repeats} steps each (frozen features cached); speed-up over {base}")
    print_before_after(rows)
    print("ms per example: " + ", ".join(f"{row['case']} {row['ms_per_example']:.2f}" for row in rows))
    if phases:
        names = list(next(iter(phases.values())))
        print(f"\nms per profiled step ({args.phase_steps} steps each): " + ", ".join(names))
        for name, part in phases.items():
            print(f"  {name}: " + " / ".join(f"{part[n]:.1f}" for n in names))
    if args.out:
        write_report(args.out, {"widths": args.widths, "batch_sizes": args.batch_sizes, "repeats": args.repeats,
                                "phase_steps": args.phase_steps, "quick": args.quick}, rows)
    return 0


def profiled_phases(run: Run, steps: range) -> dict[str, float]:
    """Mean milliseconds per step of each part of :data:`PHASES` over ``steps`` taken under the
    profiler, the whole profiled step (``step``) and the rest of it (``other``)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("train_step"):
            for step in steps:
                train_step(run, step)
    totals = {e.key: e.cpu_time_total / 1e3 / len(steps) for e in prof.key_averages() if e.key.startswith("train_step")}
    missing = [name for name in PHASES if name not in totals]
    if missing:
        raise RuntimeError(f"the profiler saw no {', '.join(missing)}: train_step lost its labels")
    parts = {name.removeprefix("train_step."): totals[name] for name in PHASES}
    return {**parts, "other": totals["train_step"] - sum(parts.values()), "step": totals["train_step"]}


if __name__ == "__main__":
    sys.exit(main())
