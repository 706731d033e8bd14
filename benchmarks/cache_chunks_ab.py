"""Before/after of one change, measured side by side: a B-shape denoise call with its batch run
through the blocks in chunks of samples (``elfreg.sampling.cache_chunks``) against the whole
batch at once, for the chunk sizes the rule picks on this machine and any others given. Every
case and a GEMM probe run in the same process on the same network, timed interleaved; each
case's time is also given over its FLOP floor (FLOPs / the probe's GFLOP/s in the same rounds).

    python benchmarks/cache_chunks_ab.py --precision bf16 --batches 8 16 32 --chunks 4 8 --repeats 5

The chunked calls compute the whole batch's values bit for bit (checked here once per case and
in ``tests/sampling/test_sampling_cache_chunks.py``); this script measures their speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from elfreg.sampling.cache_chunks import even_chunks

import run
from perf import sample
from perf.common import machine_description
from perf.flops import count
from perf.gemm import timed_beside_probe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_call_arguments(p, batches=[8, 16, 32])
    p.add_argument("--chunks", type=int, nargs="*", default=[], help="chunk sizes to time besides the rule's")
    run.add_probe_arguments(p)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    shape = run.SHAPES[args.shape]
    device = torch.device("cpu")
    net = sample.student_network(shape, args.precision, device)
    rule_of = net.sample_chunks
    cases, plans, flops = {}, {}, {}
    for batch in args.batches:
        x = sample.call_inputs(shape, batch, device)
        q = torch.randn_like(x["z"]) * 0.5  # a mid-path self-conditioning input
        rule = rule_of(x["z"])
        options = {"whole": None, **({"rule": rule} if rule else {})}
        options.update({f"chunks of {n}": even_chunks(batch, n) for n in args.chunks if n < batch})

        def call(chunks, x=x, q=q) -> torch.Tensor:
            net.sample_chunks = lambda _z, chunks=chunks: chunks  # this case's chunks instead of the rule's
            return net.denoise(x["z"], q, x["t"], x["w"], x["prompt_mask"], x["reg"], None)[0]

        whole = call(None)
        for name, chunks in options.items():
            if chunks is not None and not torch.equal(call(chunks), whole):
                raise SystemExit(f"batch {batch}, {name} {chunks}: not the whole batch's values bit for bit")
            key = f"b{batch} {name}"
            cases[key], plans[key] = (lambda c=chunks, f=call: f(c)), (batch, name, chunks)
        flops[batch] = count(lambda f=call: f(None))["total"]
    seconds, gflops = timed_beside_probe(cases, args.precision, args.repeats, device, args.probe_n)
    rows = []
    for key, (batch, name, chunks) in plans.items():
        s, base = seconds[key], seconds[f"b{batch} whole"]
        rows.append({"batch": batch, "case": name, "chunks": chunks, "seconds": s,
                     "over_floor": s / (flops[batch] / (gflops * 1e9)), "speedup_over_whole": base / s})
        print(f"batch {batch:3d}  {name:14s} {str(chunks or ''):28s} {s * 1e3:9.1f} ms  "
              f"{rows[-1]['over_floor']:.2f}x floor  {rows[-1]['speedup_over_whole']:.3f}x the whole batch")
    print(f"probe {gflops:.0f} GFLOP/s")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["benchmarks/cache_chunks_ab.py", *sys.argv[1:]]),
                                        "machine": machine_description(device), "shape": args.shape,
                                        "precision": args.precision,
                                        "repeats": args.repeats, "probe_gflops": gflops, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
