"""Canvas trimming (``sample.trim``) against the untrimmed sampler on trained toy checkpoints:
speed and accuracy measured together, side by side in one run.

    python benchmarks/canvas_trim.py runs/study-toy-level2-adamw/runs/elf-reg-long/t0/checkpoints/step-0008400 \\
        --nfe 16 64 --seeds 0 1 --margins 0 8 --out docs/performance/canvas-trim-accuracy.json

For every checkpoint, NFE and sampling seed, the held-out problems of the checkpoint's toy level
are sampled once per setting — untrimmed (``off``) and trimmed with each margin — in interleaved
order, ``--rounds`` times (timings are the median over rounds; answers are the same every round).
Reported per setting: pass@1, answers that differ from the untrimmed run's for the same sample,
wall time and its ratio to the untrimmed run, NFE used (checks included), the canvas the final
calls ran on, the share of samples trimmed, and answers that reached the end of their trimmed
canvas (cut there). ``--batch-size`` 32 is the toy evaluation's batch on a CPU
(:func:`~elfreg.toy.demo.eval_batch_size`); 1 measures latency.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from elfreg.config import Config
from elfreg.sampling.generation import GenerationResult, generate, load_checkpoint
from elfreg.toy import arith
from elfreg.toy.demo import heldout_problems
from elfreg.toy.registry import as_example

from perf.common import write_report


def _settings(margins: list[int]) -> dict[str, dict[str, Any]]:
    return {"off": {"trim": False}, **{f"trim-m{m}": {"trim": True, "trim_margin": m} for m in margins}}


def _summary(results: list[GenerationResult], problems: list[dict], prompt_lens: list[int],
             reference: list[GenerationResult] | None, seconds: list[float], length: int) -> dict[str, Any]:
    trimmed = [r for r in results if r.canvas_len < length]
    cut = [r for r in trimmed if prompt_lens[r.prompt_index] + len(r.tokens) >= r.canvas_len]
    row = {"pass@1": statistics.fmean(arith.is_correct(r.text, problems[r.prompt_index]) for r in results),
           "seconds": statistics.median(seconds), "seconds_all": [round(s, 3) for s in seconds],
           "nfe_used": statistics.fmean(r.nfe for r in results),
           "canvas_len": statistics.fmean(r.canvas_len for r in results),
           "trimmed": len(trimmed) / len(results), "cut": len(cut) / len(results)}
    if reference is not None:
        row["changed"] = statistics.fmean(a.text != b.text for a, b in zip(results, reference, strict=True))
    return row


def measure(checkpoint: str, nfes: list[int], seeds: list[int], margins: list[int], interval: int,
            patience: int, batch_size: int, limit: int, rounds: int) -> list[dict[str, Any]]:
    models = load_checkpoint(checkpoint, device="cpu", precision="fp32")
    cfg: Config = models.config
    problems = heldout_problems(cfg)[: limit or None]
    prompts = [as_example(p).prompt for p in problems]
    prompt_lens = models.frozen.canvas.build(prompts).prompt_lens.tolist()
    length = cfg.text.canvas_len
    rows = []
    for nfe in nfes:
        for seed in seeds:
            times: dict[str, list[float]] = {name: [] for name in _settings(margins)}
            answers: dict[str, list[GenerationResult]] = {}
            for _ in range(rounds):
                for name, change in _settings(margins).items():
                    sample = cfg.sample.replace(sampler="early-stop", nfe=nfe, trim_interval=interval,
                                                trim_patience=patience, **change)
                    start = time.perf_counter()
                    answers[name] = generate(models, prompts, sample, seed=seed, batch_size=batch_size,
                                             progress=False)
                    times[name].append(time.perf_counter() - start)
            base = statistics.median(times["off"])
            for name in _settings(margins):
                row = {"checkpoint": checkpoint, "nfe": nfe, "seed": seed, "setting": name,
                       **_summary(answers[name], problems, prompt_lens, None if name == "off" else answers["off"],
                                  times[name], length)}
                row["speedup"] = base / row["seconds"]
                rows.append(row)
                print(f"{Path(checkpoint).parts[-4] if len(Path(checkpoint).parts) > 3 else checkpoint} "
                      f"NFE {nfe} s{seed} {name:>8}: pass@1 {100 * row['pass@1']:.1f} %, "
                      f"changed {100 * row.get('changed', 0):.1f} %, {row['seconds']:.1f} s ({row['speedup']:.2f}x), "
                      f"NFE {row['nfe_used']:.1f}, canvas {row['canvas_len']:.1f}/{length}, "
                      f"trimmed {100 * row['trimmed']:.0f} %, cut {100 * row['cut']:.1f} %", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--nfe", type=int, nargs="+", default=[16, 64])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--margins", type=int, nargs="+", default=[8])
    p.add_argument("--interval", type=int, default=4, help="sample.trim_interval")
    p.add_argument("--patience", type=int, default=2, help="sample.trim_patience")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--limit", type=int, default=0, help="first N held-out problems (0: all)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [row for ckpt in args.checkpoints
            for row in measure(ckpt, args.nfe, args.seeds, args.margins, args.interval, args.patience,
                               args.batch_size, args.limit, args.rounds)]
    if args.out:
        write_report(args.out, vars(args) | {"out": str(args.out)}, rows)


if __name__ == "__main__":
    main()
