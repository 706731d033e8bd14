"""Before/after of one change, measured side by side: a step of ELF's Muon
(:class:`elfreg.train.muon.ElfMuon`) with the Newton–Schulz iterations of same-shaped matrices
stacked into batched products (what training runs) against one call per matrix (``stack_bytes=0``,
what it ran before), on the toy demo's student (or another width and depth). Two copies of the
student get the same random gradients every round; each optimiser steps its own copy, the two
timed one after the other, first one then the other first. After the timed rounds the two copies'
weights are compared: the change may only move the time, so the script exits 1 when they differ
by more than float rounding, and reports whether they are equal bit for bit.

    python benchmarks/muon_stack_ab.py --repeats 30
    python benchmarks/muon_stack_ab.py --width 128 --repeats 30 --out muon.json
"""

from __future__ import annotations

import copy
import statistics
import sys

import torch

from elfreg.train.muon import STACK_BYTES, ElfMuon

from perf.common import timed
from perf.demo_student import demo_student, parse_flags, report


def main() -> int:
    args = parse_flags(__doc__, repeats=20)
    cfg, student = demo_student(args)
    copies = {"stacked": student, "one call per matrix": copy.deepcopy(student)}
    optimizers = {name: ElfMuon(m.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                                stack_bytes=STACK_BYTES if name == "stacked" else 0)
                  for name, m in copies.items()}
    params = {name: list(m.parameters()) for name, m in copies.items()}
    generator = torch.Generator().manual_seed(1)

    def new_gradients() -> None:
        for a, b in zip(*params.values(), strict=True):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()

    times: dict[str, list[float]] = {name: [] for name in copies}
    for round_ in range(args.repeats + 1):  # the first round warms up, untimed
        new_gradients()
        for name in list(optimizers)[::1 if round_ % 2 else -1]:
            seconds = timed(optimizers[name].step, torch.device("cpu"))
            if round_:
                times[name].append(seconds)
    seconds = {name: statistics.median(ts) for name, ts in times.items()}
    diff = max((a - b).abs().max().item() for a, b in zip(*params.values(), strict=True))
    identical = all(torch.equal(a, b) for a, b in zip(*params.values(), strict=True))
    matrices = sum(1 for q in student.parameters() if q.dim() == 2)
    shapes = len({tuple(q.shape) for q in student.parameters() if q.dim() == 2})
    return report(args, cfg, seconds, "one call per matrix", f"{matrices} matrices in {shapes} shapes",
                  f"weights after {args.repeats + 1} steps: max |difference| {diff:.3g}, "
                  f"bit for bit equal: {identical}",
                  diff, matrices=matrices, shapes=shapes, identical=identical)


if __name__ == "__main__":
    sys.exit(main())
