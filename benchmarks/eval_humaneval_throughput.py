"""Time a full HumanEval scoring: 164 problems × 16 samples, every program run in the sandbox.

The samples are distinct programs (so none is deduplicated): per problem, half are the canonical
solution, a quarter return a wrong value and a quarter have an empty body (``pass``); a comment
with the sample number makes each program unique. Usage::

    python benchmarks/eval_humaneval_throughput.py [--task humaneval+] [--workers N] [--samples 16]

Prints the wall time, programs per second and the pass@1 obtained (which must be 0.5).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from elfreg.eval import get_task, sandbox_isolation, score_predictions
from elfreg.eval.code.expected import ExpectedOutputs


def predictions(task_name: str, samples: int, plus_limit: int | None, cache: str) -> tuple[Any, list[dict]]:
    task = get_task(task_name, plus_limit=plus_limit, expected=ExpectedOutputs(cache))
    rows = []
    for p in task.problems():
        for j in range(samples):
            if j % 2 == 0:
                body = p["canonical_solution"]
            elif j % 4 == 1:
                body = "    return '__wrong__'\n"
            else:
                body = "    pass\n"
            rows.append({"task_id": p["task_id"], "completion": f"    # sample {j}\n" + body})
    return task, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="humaneval", choices=["humaneval", "humaneval+"])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--plus-limit", type=int, default=None, help="humaneval+: plus inputs per problem")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        task, rows = predictions(args.task, args.samples, args.plus_limit, cache)
        if args.task == "humaneval+":  # record the reference outputs first; timed separately
            start = time.monotonic()
            task.expected.get([p["code"] for p in task.problems()], args.workers)
            print(f"reference outputs recorded in {time.monotonic() - start:.1f} s")
        start = time.monotonic()
        report = score_predictions(task, rows, workers=args.workers, progress=True)
        elapsed = time.monotonic() - start
    n = len(rows)
    print(report.table, end="")
    print(
        f"{n} programs scored in {elapsed:.1f} s = {n / elapsed:.1f} programs/s "
        f"({args.workers} workers, {os.cpu_count()} CPUs, sandbox isolation: {sandbox_isolation()})"
    )


if __name__ == "__main__":
    main()
