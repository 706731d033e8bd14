"""Before/after of ``train.compile``, measured side by side: training steps of the toy demo's
ELF-REG student with its blocks run eagerly and through ``torch.compile`` (what the demo trains
with). Each case is its own run of the demo's config; they step in turns, on batches whose
frozen features are cached beforehand, so only the student's step is timed. The warm-up rounds,
untimed as steps, include the compiling; their extra time over the median step is reported as
the compile cost the demo pays once per process.

Compiled kernels round differently from eager ones, so the two runs' losses drift apart by float
rounding from the first steps; the script reports the largest relative difference of the
per-step total loss over the warm-up rounds (the first steps, before rounding has compounded)
and exits 1 above 1e-3, which would mean the compiled blocks compute something else.

    python benchmarks/train_compile_ab.py --repeats 30
    python benchmarks/train_compile_ab.py --quick --repeats 2 --out compile.json

The toy LMs come from the demo's cache (``$ELFREG_CACHE``), built there first when missing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from elfreg.toy.demo import demo_config, variant_config
from elfreg.train.build import start_run
from elfreg.train.step import micro_batch, train_step

from perf.common import before_after_rows, interleaved, print_before_after, timed, write_report

CASES = {"eager": False, "compiled blocks": True}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=30, help="timed steps of each case")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps of each case first (the compiling)")
    p.add_argument("--quick", action="store_true", help="the quick demo's run (its toy LMs build in a minute)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, compiled in CASES.items():
            base = demo_config(quick=args.quick, overrides=[f"train.compile={str(compiled).lower()}"])
            run, _ = start_run(variant_config(base, "elf-reg", Path(tmp) / name.replace(" ", "-"), progress=False),
                               None, resume_existing=False)
            for k in range(args.warmup + args.repeats):  # frozen features of every batch to come, untimed
                micro_batch(run, k)
            runs[name] = run
        warm: dict[str, float] = dict.fromkeys(CASES, 0.0)
        losses: dict[str, list[float]] = {name: [] for name in CASES}
        for step in range(args.warmup):  # untimed as steps: the compiling happens here
            for name in CASES:
                result: list = []
                warm[name] += timed(lambda n=name, s=step, r=result: r.append(train_step(runs[n], s)),
                                    torch.device("cpu"))
                losses[name].append(result[0].losses["total"])
        steps = dict.fromkeys(CASES, args.warmup)

        def next_step(name: str) -> None:
            train_step(runs[name], steps[name])
            steps[name] += 1

        seconds = interleaved({name: lambda n=name: next_step(n) for name in CASES}, args.repeats,
                              torch.device("cpu"), warmup=0)
    rows = before_after_rows(seconds, "eager")
    for row in rows:
        row["warmup_extra_seconds"] = warm[row["case"]] - args.warmup * seconds[row["case"]]
    diff = max(abs(a - b) / max(abs(b), 1e-8) for a, b in zip(*losses.values(), strict=True))
    cfg = runs["eager"].cfg
    print(f"demo student {cfg.model.width} x {cfg.model.depth}, batch {cfg.train.batch_size}, threads: "
          f"{torch.get_num_threads()}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"median of {args.repeats} steps each")
    print_before_after(rows)
    print(f"  compiling (warm-up time over {args.warmup} median steps): "
          f"{rows[1]['warmup_extra_seconds']:.1f} s; total loss over the warm-up steps: largest relative "
          f"difference {diff:.2g}")
    if args.out:
        write_report(args.out, {"repeats": args.repeats, "warmup": args.warmup, "quick": args.quick,
                                "width": cfg.model.width, "batch": cfg.train.batch_size},
                     rows, loss_relative_difference=diff, warmup_losses=losses)
    return 0 if diff <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
