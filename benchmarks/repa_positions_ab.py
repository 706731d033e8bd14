"""Before/after of one change, measured side by side: training steps of the toy demo's ELF-REG
student with the REPA projector run only at the positions L_REPA reads (answer content and the
REG position, ``repa_positions``: what training runs) against the projector run at every canvas
position and the unread rows dropped afterwards (what it ran before). Both train one run, step
by step in turns (which goes first alternates), on batches whose frozen features are cached
beforehand, so only the student's step is timed.

Before the timed steps, both compute the loss of the same micro-batch with the same draws; the
change may only move the time, so the script exits 1 when a loss term differs by more than float
rounding. It also reports the share of canvas positions the projector now runs on.

    python benchmarks/repa_positions_ab.py --repeats 40
    python benchmarks/repa_positions_ab.py --repeats 40 --out repa.json
    python benchmarks/repa_positions_ab.py --quick --repeats 2     # the quick demo's run: its smaller toy LMs

The toy LMs come from the demo's cache (``$ELFREG_CACHE``), built there first when missing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from elfreg.flow.objective import elf_reg_loss, repa_mask
from elfreg.model.student import Student
from elfreg.toy.demo import demo_config, variant_config
from elfreg.train.batch import row_draws
from elfreg.train.build import start_run
from elfreg.train.step import micro_batch, micro_rows, train_step

from perf.common import before_after_rows, print_before_after, timed, write_report


class ProjectEverywhere:
    """The student as training called it before: the projector on every position, the rows
    L_REPA reads picked from its output."""

    def __init__(self, student: Student):
        self.student = student

    def __getattr__(self, name: str):  # everything else is the student's: its shape, its heads
        return getattr(self.student, name)

    def __call__(self, *args, repa_positions: torch.Tensor | None = None, **kwargs):
        out = self.student(*args, **kwargs)
        if repa_positions is not None:
            out.repa = out.repa[repa_positions]
        return out

    def decode_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.student.decode_logits(hidden)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=40, help="timed steps of each case")
    p.add_argument("--quick", action="store_true", help="the quick demo's run (its toy LMs build in a minute)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = variant_config(demo_config(quick=args.quick), "elf-reg", Path(tmp), progress=False)
        run, _ = start_run(cfg, None, resume_existing=False)
        steps = 2 * (args.repeats + 1)
        for k in range(steps):  # frozen features of every batch to come, untimed
            micro_batch(run, k)
        student = run.student
        callers = {"projector at read positions": lambda fn, *a, **k: fn(student, *a, **k),
                   "projector everywhere": lambda fn, *a, **k: fn(ProjectEverywhere(student), *a, **k)}

        batch = micro_batch(run, 0)
        terms = {}
        for name, call in callers.items():
            draws = row_draws(cfg.train.seed, 0, micro_rows(run, 0), run.device)
            with torch.no_grad():
                out = call(elf_reg_loss, batch, cfg.flow, cfg.loss, draws, None)
            terms[name] = {key: float(v) for key, v in out.__dict__.items()}
        diff = max(abs(a - b) / max(abs(b), 1e-8)
                   for a, b in zip(*(t.values() for t in terms.values()), strict=True))
        mask = repa_mask(batch.canvas.content_mask, cfg.model.extra_token == "reg")
        share = float(mask.sum()) / mask.numel()

        times: dict[str, list[float]] = {name: [] for name in callers}
        step = 0
        for round_ in range(args.repeats + 1):  # the first round warms up, untimed
            for name in list(callers)[::1 if round_ % 2 else -1]:
                run.model = callers[name]
                seconds = timed(lambda s=step: train_step(run, s), torch.device("cpu"))
                step += 1
                if round_:
                    times[name].append(seconds)
    seconds = {name: statistics.median(ts) for name, ts in times.items()}
    rows = before_after_rows(seconds, "projector everywhere")
    print(f"demo student {cfg.model.width} x {cfg.model.depth}, batch {cfg.train.batch_size}, threads: "
          f"{torch.get_num_threads()}, median of {args.repeats} steps each; the projector now runs on "
          f"{100 * share:.1f} % of the positions it ran on")
    print_before_after(rows)
    print(f"  loss terms of one micro-batch: largest relative difference {diff:.2g}")
    if args.out:
        write_report(args.out, {"repeats": args.repeats, "quick": args.quick, "width": cfg.model.width,
                                "batch": cfg.train.batch_size},
                     rows, projected_share=share, loss_relative_difference=diff, loss_terms=terms)
    return 0 if diff <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
