"""Before/after of one change, measured side by side: a B-shape bf16 denoise call with attention as
two batched matmuls and a softmax (``elfreg.model.blocks.softmax_attention``, what such a call
runs on a CPU) against the same call with SDPA's fused kernel (what it ran before). Both run in
the same process on the same network, timed interleaved with a GEMM probe; each is given over its
FLOP floor, with its attention ops' share of the call and their own time over floor (one
profiled call, :func:`perf.breakdown.time_breakdown`), and the relative error of its x̂ against
the fp32 call of the same student (what the bf16 scores cost in accuracy). The process keeps
freed memory (:func:`elfreg.host_memory.keep_freed_memory`), as ``elfreg sample`` does.
``--group-mib`` adds the matmul path with groups of score matrices of other sizes than
``blocks.SCORES_BYTES``; ``--precision fp32`` compares the two paths on the fp32 call, where
SDPA stays.

    python benchmarks/attention_ab.py --batches 1 8 16 32 --repeats 7
    python benchmarks/attention_ab.py --batches 16 --group-mib 0.5 8 32 --repeats 7
    python benchmarks/attention_ab.py --precision fp32 --batches 8 --repeats 5
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from unittest import mock

import torch

from elfreg.host_memory import keep_freed_memory
from elfreg.model import blocks
from elfreg.model.blocks import softmax_attention
from elfreg.sampling import StudentNetwork

import run
from perf import sample
from perf.breakdown import time_breakdown
from perf.common import write_report
from perf.flops import count
from perf.gemm import timed_beside_probe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_call_arguments(p, batches=[1, 8, 32])
    p.add_argument("--group-mib", type=float, nargs="*", default=[], help="more group sizes of the matmul path")
    run.add_probe_arguments(p)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    shape = run.SHAPES[args.shape]
    device = torch.device("cpu")
    kept = keep_freed_memory()
    net = sample.student_network(shape, args.precision, device)
    fp32 = StudentNetwork(net.student, bf16=False, eos_id=None)
    groups = {"matmuls": blocks.SCORES_BYTES, "sdpa": None,
              **{f"matmuls, groups of {mib:g} MiB": int(mib * 2**20) for mib in args.group_mib}}
    cases, plans = {}, {}
    for batch in args.batches:
        x = sample.call_inputs(shape, batch, device)
        q = torch.randn_like(x["z"]) * 0.5  # a mid-path self-conditioning input

        def call(scores_bytes, network=net, x=x, q=q) -> torch.Tensor:
            # the path's switch, not the network's: the "sdpa" call is the call as it was
            in_groups = functools.partial(softmax_attention, scores_bytes=scores_bytes)
            with (mock.patch.object(blocks, "attention_in_matmuls", return_value=scores_bytes is not None),
                  mock.patch.object(blocks, "softmax_attention", in_groups)):
                return network.denoise(x["z"], q, x["t"], x["w"], x["prompt_mask"], x["reg"], None)[0]

        exact = call(None, fp32).float()
        flops = count(lambda f=call: f(blocks.SCORES_BYTES))
        for path, scores_bytes in groups.items():
            fn = lambda f=call, b=scores_bytes: f(b)  # noqa: E731
            error = float((fn().float() - exact).norm() / exact.norm())
            cases[f"b{batch} {path}"], plans[f"b{batch} {path}"] = fn, (batch, path, flops, error)
    seconds, gflops = timed_beside_probe(cases, args.precision, args.repeats, device, args.probe_n)
    rows = []
    for key, (batch, path, flops, error) in plans.items():
        s, base = seconds[key], seconds[f"b{batch} sdpa"]
        attention = time_breakdown(cases[key], flops, gflops, device)["attention"]
        rows.append({"batch": batch, "attention": path, "seconds": s, "flops": flops["total"],
                     "over_floor": s / (flops["total"] / (gflops * 1e9)), "speedup_over_sdpa": base / s,
                     "attention_share": attention["share"], "attention_over_floor": attention["over_floor"],
                     "relative_error_vs_fp32": error})
        r = rows[-1]
        print(f"batch {batch:3d}  {path:26s} {s * 1e3:9.1f} ms  {r['over_floor']:.2f}x floor  "
              f"{r['speedup_over_sdpa']:.3f}x sdpa  attention {r['attention_share']:.1%} of ops, "
              f"{r['attention_over_floor']:.2f}x its floor  error vs fp32 {error:.4%}")
    print(f"probe {gflops:.0f} GFLOP/s")
    if args.out:
        write_report(args.out, {"shape": args.shape, "precision": args.precision, "batches": args.batches,
                                "group_mib": args.group_mib, "repeats": args.repeats, "probe_n": args.probe_n}, rows,
                     command=" ".join(["benchmarks/attention_ab.py", *sys.argv[1:]]),
                     host_memory_kept=kept, probe_gflops=gflops)


if __name__ == "__main__":
    main()
