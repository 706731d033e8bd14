"""What every measurement shares: the machine description, interleaved timing and peak memory.

Timings on a shared machine are noisy, so cases that are compared are timed *interleaved*: one
repeat of every case, then the next repeat of every case, and so on; each case reports the median
of its repeats. Ratios are only ever taken between cases of the same interleaved run.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from elfreg.provenance import code_version

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_description() -> dict[str, Any]:
    """CPU model and the vector flags that matter for fp32/bf16 GEMMs, from /proc/cpuinfo
    (falling back to ``lscpu``)."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("unknown", "", platform.processor()):
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
            for line in out.splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model name":
                    model = value.strip()
                elif key.strip() == "Flags":
                    flags = set(value.split())
        except (OSError, subprocess.SubprocessError):
            pass
    return {"model": model, "logical_cpus": os.cpu_count(), "flags": {f: f in flags for f in CPU_FLAGS}}


def machine_description(device: torch.device) -> dict[str, Any]:
    """Everything a reader needs to compare two result files: CPU, threads, torch, device."""
    out: dict[str, Any] = {
        "cpu": cpu_description(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "python": platform.python_version(),
        "mkldnn_bf16": bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def write_report(out: Path, settings: dict[str, Any], rows: list[dict[str, Any]], **extra: Any) -> None:
    """A benchmark script's JSON: its settings, the CPU's description, the code that ran, its rows."""
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"settings": settings, **extra, "machine": machine_description(torch.device("cpu")),
              "code": code_version(), "rows": rows}
    out.write_text(json.dumps(report, indent=1) + "\n")


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (CUDA); nothing to wait for on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of one call of ``fn``, device work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable[[], Any]], repeats: int, device: torch.device,
                warmup: int = 1) -> dict[str, float]:
    """Median wall seconds of each case over ``repeats`` rounds; every round calls every case
    once, in order, after ``warmup`` untimed rounds."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(timed(fn, device))
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_memory_bytes(device: torch.device) -> dict[str, float]:
    """Peak memory so far: the process's peak RSS (``ru_maxrss``, a running maximum over the
    whole process) and, on CUDA, ``torch.cuda.max_memory_allocated`` since the last reset."""
    out = {"peak_rss_bytes": float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    if device.type == "cuda":
        out["cuda_max_allocated_bytes"] = float(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
    return out


def autocast_for(device: torch.device, precision: str):
    """bf16 autocast on ``device`` for ``precision == "bf16"``, else no autocast."""
    from elfreg.device import autocast

    return autocast(device, precision == "bf16")


def before_after_rows(seconds: dict[str, float], before: str) -> list[dict[str, Any]]:
    """A before/after script's rows: each case's seconds and its speed-up over case ``before``."""
    return [{"case": name, "seconds": s, "speedup": seconds[before] / s} for name, s in seconds.items()]


def print_before_after(rows: list[dict[str, Any]]) -> None:
    """The rows of :func:`before_after_rows`, one line each: milliseconds and speed-up."""
    width = max(len(r["case"]) for r in rows)
    for r in rows:
        print(f"  {r['case']:<{width}} {1000 * r['seconds']:8.2f} ms  {r['speedup']:.3f}x")
