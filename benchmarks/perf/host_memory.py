"""Host memory: the ELF-REG training step, or a bf16 denoise call of its student, with glibc
malloc's own behaviour (``release``) against ``keep`` (:func:`elfreg.host_memory.keep_freed_memory`,
the default of training and of the sampling commands), each in a process of its own because the
setting is process-wide and cannot be undone. Processes of the two settings alternate, round
after round, so both see the same machine; each builds the same student (:class:`perf.train.StepCase`,
or :func:`perf.sample.student_network` for ``denoise``), runs untimed warm-up steps (calls), then
timed ones, and reports their median seconds, the page faults and system time per step, and its
peak RSS.

Run as a script it is one such process (``--child``); :func:`host_memory_section` runs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SETTINGS = ("release", "keep")


def _peak_rss_bytes() -> float:
    """This process's own peak RSS: ``VmHWM`` (``ru_maxrss`` carries the parent's peak across
    ``fork``/``exec``, so a child would report the benchmark's peak, not its own)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _denoise_call(shape: Any, precision: str, batch: int) -> Callable[[], dict[str, float]]:
    """One denoise call of the ELF-REG student at ``batch``, timed: ``{"step": seconds}``."""
    import torch

    from .sample import call_inputs, student_network

    net = student_network(shape, precision, torch.device("cpu"))
    x = call_inputs(shape, batch, torch.device("cpu"))
    q = torch.randn_like(x["z"]) * 0.5

    def call() -> dict[str, float]:
        start = time.perf_counter()
        net.denoise(x["z"], q, x["t"], x["w"], x["prompt_mask"], x["reg"], None)
        return {"step": time.perf_counter() - start}

    return call


def _child(shape_json: str, precision: str, setting: str, warmup: int, steps: int,
           batch: int | None = None) -> dict[str, Any]:
    import torch

    from elfreg.host_memory import apply_host_memory

    from .train import Shape, StepCase

    applied = apply_host_memory(setting)
    shape = Shape(**json.loads(shape_json))
    step = (StepCase(shape, True, precision, torch.device("cpu")).step if batch is None
            else _denoise_call(shape, precision, batch))
    for _ in range(warmup):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF)
    runs = [step() for _ in range(steps)]
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"setting": setting, "applied": applied,
            "seconds": {k: statistics.median(r[k] for r in runs) for k in runs[0]},
            "page_faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
            "system_seconds_per_step": (after.ru_stime - before.ru_stime) / steps,
            "peak_rss_bytes": _peak_rss_bytes()}


def host_memory_section(shape: Any, precision: str, rounds: int, steps: int, warmup: int = 1,
                        denoise_batch: int | None = None) -> dict[str, Any]:
    """``rounds`` rounds of one process per setting (release, keep), each ``warmup`` + ``steps``
    steps of the ELF-REG student at ``shape`` on the CPU (denoise calls at ``denoise_batch`` where
    given); per setting the median over rounds of each process's median step seconds, page faults
    and system seconds per step, and the largest peak RSS; ``release_over_keep`` is the ratio of
    the median step times."""
    shape_json = json.dumps(dataclasses.asdict(shape))
    bench_dir = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    for _ in range(rounds):
        for setting in SETTINGS:
            cmd = [sys.executable, "-m", "perf.host_memory", "--child", "--shape", shape_json, "--precision",
                   precision, "--setting", setting, "--warmup", str(warmup), "--steps", str(steps),
                   *(["--denoise-batch", str(denoise_batch)] if denoise_batch else [])]
            done = subprocess.run(cmd, cwd=bench_dir, capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {"shape": shape.name, "precision": precision, "rounds": rounds, "steps": steps,
                           **({"denoise_batch": denoise_batch} if denoise_batch else {})}
    for setting, rs in runs.items():
        out[setting] = {"applied": rs[0]["applied"],
                        "step_seconds": statistics.median(r["seconds"]["step"] for r in rs),
                        "phase_seconds": {k: statistics.median(r["seconds"][k] for r in rs) for k in rs[0]["seconds"]},
                        "page_faults_per_step": statistics.median(r["page_faults_per_step"] for r in rs),
                        "system_seconds_per_step": statistics.median(r["system_seconds_per_step"] for r in rs),
                        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rs)}
    out["release_over_keep"] = out["release"]["step_seconds"] / out["keep"]["step_seconds"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description="one process of the host-memory comparison")
    p.add_argument("--child", action="store_true", required=True)
    p.add_argument("--shape", required=True, help="a perf.train.Shape as JSON")
    p.add_argument("--precision", required=True, choices=["fp32", "bf16"])
    p.add_argument("--setting", required=True, choices=SETTINGS)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--denoise-batch", type=int, help="time denoise calls at this batch, not training steps")
    a = p.parse_args()
    print(json.dumps(_child(a.shape, a.precision, a.setting, a.warmup, a.steps, a.denoise_batch)))


if __name__ == "__main__":
    main()
