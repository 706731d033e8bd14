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

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

from elfreg.model.presets import student_from_config
from elfreg.toy.assets import DEFAULT_ENCODER, DEFAULT_TEACHER
from elfreg.toy.demo import demo_config
from elfreg.toy.tokenizer import DEFAULT_VOCAB_SIZE
from elfreg.train.muon import STACK_BYTES, ElfMuon

from perf.common import timed, write_report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, help="student width (default: the demo's)")
    p.add_argument("--depth", type=int, help="student depth (default: the demo's)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    overrides = [f"model.{k}={v}" for k, v in (("width", args.width), ("depth", args.depth)) if v is not None]
    if args.width is not None:
        overrides.append(f"model.projector_hidden={2 * args.width}")
    cfg = demo_config(overrides=overrides)
    torch.manual_seed(0)
    student = student_from_config(cfg, DEFAULT_ENCODER.hidden_size, DEFAULT_VOCAB_SIZE, DEFAULT_TEACHER.hidden_size)
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
    base = seconds["one call per matrix"]
    rows = [{"case": name, "seconds": s, "speedup": base / s} for name, s in seconds.items()]
    print(f"student {cfg.model.width} x {cfg.model.depth}: {matrices} matrices in {shapes} shapes, "
          f"threads: {torch.get_num_threads()}, median of {args.repeats} steps")
    for r in rows:
        print(f"  {r['case']:<20} {1000 * r['seconds']:7.2f} ms  {r['speedup']:.2f}x")
    print(f"  weights after {args.repeats + 1} steps: max |difference| {diff:.3g}, bit for bit equal: {identical}")
    if args.out:
        write_report(args.out, {"width": cfg.model.width, "depth": cfg.model.depth, "repeats": args.repeats},
                     rows, matrices=matrices, shapes=shapes, max_abs_difference=diff, identical=identical)
    return 0 if diff <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
