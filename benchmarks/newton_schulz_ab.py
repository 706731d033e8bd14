"""Before/after of one change, measured side by side: the Newton–Schulz iterations of ELF's Muon
(:func:`elfreg.train.muon.newton_schulz_iterations`) with each iteration's scalings and sums done
by the products themselves (two ``baddbmm`` calls: what training runs) against the iteration
written as separate products, scalings and sums, X ← aX + (bA + cA²)X (what it ran before), on
stacks of the shapes of the toy demo's student's matrices (or another width and depth), wide and
normed as :func:`~elfreg.train.muon.newton_schulz` hands them over. Both are timed interleaved
on the same stacks; the script exits 1 when their results differ by more than float rounding.

    python benchmarks/newton_schulz_ab.py --repeats 50
    python benchmarks/newton_schulz_ab.py --width 128 --out ns.json
"""

from __future__ import annotations

import sys

import torch

from elfreg.train.muon import NS_COEFFICIENTS, NS_STEPS, newton_schulz_iterations, stacks

from perf.common import interleaved
from perf.demo_student import demo_student, parse_flags, report


def written_out(x: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """The iterations as they were written before: three products, three scalings, two sums."""
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def wide_normed_stack(shape: tuple[int, int], count: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn((count, *sorted(shape)), generator=generator)
    return x / x.norm(dim=(-2, -1), keepdim=True)


def main() -> int:
    args = parse_flags(__doc__, repeats=50)
    cfg, student = demo_student(args)
    generator = torch.Generator().manual_seed(1)
    stacked = [wide_normed_stack(tuple(s[0].shape), len(s), generator)
               for s in stacks([q for q in student.parameters() if q.dim() == 2])]
    cases = {"fused (baddbmm)": lambda: [newton_schulz_iterations(x) for x in stacked],
             "written out": lambda: [written_out(x) for x in stacked]}
    seconds = interleaved(cases, args.repeats, torch.device("cpu"), warmup=3)
    diff = max((newton_schulz_iterations(x) - written_out(x)).abs().max().item() for x in stacked)
    return report(args, cfg, seconds, "written out", f"{len(stacked)} stacks",
                  f"results: max |difference| {diff:.3g}", diff)


if __name__ == "__main__":
    sys.exit(main())
