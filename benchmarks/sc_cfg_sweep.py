"""The SC-CFG scale w at sampling, swept on a trained toy-demo checkpoint.

    python benchmarks/sc_cfg_sweep.py --run runs/demo/elf-reg --ws 1 1.5 2 3 5 --split valid

Scores each w on the held-out split of the checkpoint's toy task (pass@1 ± sample std over
sampling seeds), for each sampler and NFE given. Tune on ``valid``; report on ``test``.
Writes a JSON file with the checkpoint's config beside the table when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from elfreg.checkpoint import open_checkpoint
from elfreg.device import resolve_precision
from elfreg.text.load import load_frozen_text
from elfreg.toy.demo import evaluate, heldout_problems


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a demo run folder (e.g. runs/demo/elf-reg) or checkpoint")
    p.add_argument("--ws", type=float, nargs="+", default=[1.0, 1.5, 2.0, 3.0, 5.0])
    p.add_argument("--split", choices=["valid", "test"], default="valid")
    p.add_argument("--nfes", type=int, nargs="+", default=[16])
    p.add_argument("--samplers", nargs="+", default=["early-stop"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--limit", type=int, default=0, help="only the first N problems of the split (0: all)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()

    ckpt = open_checkpoint(args.run)
    cfg = ckpt.config
    cfg.eval.split = args.split
    cfg.eval.limit = args.limit
    problems = heldout_problems(cfg)
    frozen = load_frozen_text(cfg.text, with_teacher=False)
    student = ckpt.load_student(use_ema=True)
    rows = []
    for sampler in args.samplers:
        for nfe in args.nfes:
            for w in args.ws:
                t0 = time.perf_counter()
                r = evaluate(student, frozen, problems, cfg, cfg.sample.replace(sampler=sampler, nfe=nfe, sc_cfg=w),
                             args.seeds, progress=False)
                rows.append({**r, "sc_cfg": w, "seconds": time.perf_counter() - t0})
                print(f"{sampler:<11} NFE {nfe:>3}  w {w:>4}: {100 * r['mean']:5.1f} ± {100 * r['std']:3.1f} %"
                      f"  (token match {100 * r['token_match']:.0f} %)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"checkpoint": str(ckpt.path), "split": args.split,
                                              "n_problems": len(problems), "precision": resolve_precision("cpu"),
                                              "config": cfg.to_dict(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
