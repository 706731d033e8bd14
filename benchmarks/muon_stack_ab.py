"""Before/after of one change, measured side by side: a step of ELF's Muon
(:class:`elfreg.train.muon.ElfMuon`) with the Newton–Schulz iterations of same-shaped matrices
stacked into batched products (what training runs) against one call per matrix (``stack_bytes=0``,
what it ran before), on the toy demo's student (or another width and depth). Two copies of the
student get the same random gradients every round; each optimiser steps its own copy, the two
timed one after the other, first one then the other first. After the timed rounds the two copies'
weights are compared: the change may only move the time, so the script exits 1 when they differ
by more than float rounding, and reports whether they are equal bit for bit.

With ``--before-revision REV`` the "before" is instead the optimiser as git revision ``REV`` of
this checkout wrote it (``src/elfreg/train/muon.py`` at ``REV``, loaded on its own), stacked as
today's: how a rewrite of the optimiser's step (such as the one that made it work on lists of
tensors) is measured.

    python benchmarks/muon_stack_ab.py --repeats 30
    python benchmarks/muon_stack_ab.py --width 128 --repeats 30 --out muon.json
    python benchmarks/muon_stack_ab.py --repeats 30 --before-revision 8ef5b81
"""

from __future__ import annotations

import copy
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from elfreg.train.muon import ElfMuon

from perf.common import timed
from perf.demo_student import demo_student, parse_flags, report


def optimizer_at_revision(revision: str) -> type[torch.optim.Optimizer]:
    """``ElfMuon`` as ``src/elfreg/train/muon.py`` was at git revision ``revision`` of this
    checkout (the file imports only torch, so it loads on its own)."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{revision}:src/elfreg/train/muon.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "muon_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("muon_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ElfMuon


def main() -> int:
    args = parse_flags(__doc__, repeats=20, extra=[("--before-revision", {
        "help": "compare with ElfMuon at this git revision instead of one call per matrix"})])
    cfg, student = demo_student(args)
    twin = copy.deepcopy(student)
    if args.before_revision:
        now, before = "this checkout", f"at {args.before_revision}"
        before_optimizer = optimizer_at_revision(args.before_revision)(
            twin.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    else:
        now, before = "stacked", "one call per matrix"
        before_optimizer = ElfMuon(twin.parameters(), lr=cfg.train.lr,
                                   weight_decay=cfg.train.weight_decay, stack_bytes=0)
    optimizers = {now: ElfMuon(student.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay),
                  before: before_optimizer}
    params = {now: list(student.parameters()), before: list(twin.parameters())}
    generator = torch.Generator().manual_seed(1)

    def new_gradients() -> None:
        for a, b in zip(*params.values(), strict=True):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()

    times: dict[str, list[float]] = {name: [] for name in optimizers}
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
    return report(args, cfg, seconds, before, f"{matrices} matrices in {shapes} shapes",
                  f"weights after {args.repeats + 1} steps: max |difference| {diff:.3g}, "
                  f"bit for bit equal: {identical}",
                  diff, matrices=matrices, shapes=shapes, identical=identical)


if __name__ == "__main__":
    sys.exit(main())
