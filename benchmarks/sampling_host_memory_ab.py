"""Before/after of one change, measured side by side: B-shape denoise calls with glibc malloc's own
behaviour (``--host-memory release``) against ``keep`` (:func:`elfreg.host_memory.keep_freed_memory`,
which ``elfreg sample`` and ``elfreg eval`` now apply as training does). The setting is
process-wide, so each setting runs in processes of its own, alternating round after round
(:func:`perf.host_memory.host_memory_section`); each reports its median call, its page faults and
system time per call, and its peak RSS.

    python benchmarks/sampling_host_memory_ab.py --batches 8 16 32 --rounds 3 --calls 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import run
from perf.common import write_report
from perf.host_memory import host_memory_section


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_call_arguments(p, batches=[8, 16, 32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=3, help="timed calls per process, after one untimed")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    shape = run.SHAPES[args.shape]
    sections = []
    for batch in args.batches:
        sec = host_memory_section(shape, args.precision, args.rounds, args.calls, denoise_batch=batch)
        sections.append(sec)
        for setting in ("release", "keep"):
            row = sec[setting]
            print(f"batch {batch:3d}  {setting:8s} {row['step_seconds'] * 1e3:9.1f} ms  "
                  f"{row['page_faults_per_step']:9.0f} page faults  {row['system_seconds_per_step']:.3f} s system  "
                  f"peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB")
        print(f"batch {batch:3d}  release / keep {sec['release_over_keep']:.3f}")
    if args.out:
        write_report(args.out, {"shape": args.shape, "precision": args.precision, "batches": args.batches,
                                "rounds": args.rounds, "calls": args.calls}, sections,
                     command=" ".join(["benchmarks/sampling_host_memory_ab.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
