"""Wall time of a toy evaluation's sampling at several batch sizes, side by side in one run, and
whether the answers are the same at every batch size.

    python benchmarks/toy_eval_batch.py runs/study-toy-level2/runs/elf-reg-long/t0/checkpoints/step-0008400 \\
        --batch-sizes 256 64 32 --nfe 64 --rounds 3 --out docs/performance/toy-eval-batch.json

Every round samples the checkpoint's held-out problems once per batch size (interleaved), early-stop
at ``--nfe`` with the checkpoint's sampler settings, seed 0, fp32 on the CPU. ``elfreg.toy.demo``
picks its evaluation batch (:func:`~elfreg.toy.demo.eval_batch_size`) from this measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from elfreg.sampling.generate import generate, load_checkpoint
from elfreg.toy.demo import heldout_problems
from elfreg.toy.registry import as_example

from perf.common import write_report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 64, 32])
    p.add_argument("--nfe", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    models = load_checkpoint(args.checkpoint, device="cpu", precision="fp32")
    prompts = [as_example(q).prompt for q in heldout_problems(models.config)]
    sample = models.config.sample.replace(sampler="early-stop", nfe=args.nfe)
    seconds: dict[int, list[float]] = {b: [] for b in args.batch_sizes}
    answers: dict[int, list[str]] = {}
    for k in range(args.rounds):
        for b in args.batch_sizes:
            start = time.perf_counter()
            results = generate(models, prompts, sample, seed=0, batch_size=b, progress=False)
            seconds[b].append(round(time.perf_counter() - start, 3))
            answers.setdefault(b, [r.text for r in results])
            print(f"round {k + 1}, batch {b}: {seconds[b][-1]:.1f} s", flush=True)
    first = args.batch_sizes[0]
    rows = [{"batch_size": b, "seconds": statistics.median(s), "seconds_all": s,
             "speedup_over_first": statistics.median(seconds[first]) / statistics.median(s),
             "answers_differ_from_first": sum(a != c for a, c in zip(answers[b], answers[first], strict=True))}
            for b, s in seconds.items()]
    for row in rows:
        print(f"batch {row['batch_size']}: {row['seconds']:.1f} s, {row['speedup_over_first']:.2f}x batch {first}, "
              f"{row['answers_differ_from_first']} of {len(prompts)} answers differ")
    if args.out:
        write_report(args.out, vars(args) | {"out": str(args.out)}, rows, problems=len(prompts))


if __name__ == "__main__":
    main()
