"""Smoke test of the benchmark instrument: ``benchmarks/run.py --quick`` runs and writes every
section with finite positive numbers and the machine description (no timing is asserted)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def _numbers(node, path=""):
    if isinstance(node, bool):
        return
    if isinstance(node, (int, float)):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{path}[{i}]")


def test_quick_benchmark_writes_every_section(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    assert (out / "results.md").read_text().startswith("# elfreg benchmark")

    machine = result["machine"]
    assert machine["cpu"]["model"] and machine["torch"] and machine["device"] and machine["threads"] >= 1
    with open("/proc/cpuinfo") as f:  # what this CPU says of the flags the report names, read here
        flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    assert machine["cpu"]["flags"] == {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16",
                                                                 "amx_tile")}

    assert set(result["gemm"]["ceiling_gflops"]) == {"fp32", "bf16"}
    assert len(result["train"]) == 2
    for section in result["train"]:
        for model in ("elf_reg", "elf"):
            assert set(section[model]["seconds"]) == {"forward", "backward", "optimizer", "step"}
            assert section[model]["flops"]["forward"] > 0 and section[model]["flops"]["backward"] > 0
        assert section["elf_reg_over_elf"] > 0 and section["modelled_end_to_end"]["elf_reg_over_elf"] > 0
        assert set(section["optimizer_impls"]["seconds"]) == {"for-loop", "foreach", "fused", "muon"}
        e2e = section["end_to_end"]  # the frozen reads are added to the steps they belong to
        assert e2e["elf_step"] > section["elf"]["seconds"]["step"]
        assert e2e["elf_reg_step"] > section["elf_reg"]["seconds"]["step"] + e2e["teacher_read"]
    calls = [row for pc in result["sampling"]["per_call"] for row in pc["calls"].values()]
    # in bf16 the old per-call-cast denoise is timed beside the network's (fp32 has no casts)
    casts = {"denoise, autocast casts"} if result["precision"] == "bf16" else set()
    heads = {row["kind"] for row in calls if row["kind"].startswith("decode, head on ")}
    trimmed = {row["kind"] for row in calls if row["kind"].startswith("denoise, canvas ")}
    assert heads and trimmed and {row["kind"] for row in calls} == {"denoise", "decode"} | casts | heads | trimmed
    for pc in result["sampling"]["per_call"]:
        for row in pc["calls"].values():
            denoise = pc["calls"][f"denoise_b{row['batch']}"]["flops"]
            if row["kind"] in heads:  # the head on fewer positions: fewer FLOPs, same forward
                assert denoise < row["flops"] < pc["calls"][f"decode_b{row['batch']}"]["flops"]
            if row["kind"] in trimmed:  # a shorter canvas: fewer FLOPs than the whole one
                assert 0 < row["flops"] < denoise
    for row in calls:  # the profiled call of each denoise and decode row, split into op groups
        if row["kind"] in ("denoise", "decode"):
            bd = row["breakdown"]
            assert sum(bd[g]["share"] for g in ("matmul", "attention", "other")) == pytest.approx(1.0)
            assert bd["matmul"]["flops"] + bd["attention"]["flops"] == pytest.approx(row["flops"])
    rows = result["sampling"]["end_to_end"][0]["rows"].values()
    assert {r["model"] for r in rows} == {"elf-reg", "ar-kv-cache"}
    assert {r["sampler"] for r in rows} >= {"early-stop", "full-span"}
    (host,) = result["host_memory"]  # one process per setting; the sections in this one keep freed memory
    assert host["keep"]["applied"] and not host["release"]["applied"] and result["host_memory_kept"]
    assert host["release_over_keep"] > 0 and host["keep"]["page_faults_per_step"] >= 0
    assert set(result["memory"]) >= {"gemm", "sampling"} and all(
        m["peak_rss_bytes"] > 0 for m in result["memory"].values())

    numbers = list(_numbers({k: v for k, v in result.items() if k != "machine"}))
    assert numbers
    # time outside any op is a difference of two timings, and a step may fault no page and spend
    # no system time: finite, and not asserted positive
    zero_ok = ("unattributed_seconds", "page_faults_per_step", "system_seconds_per_step")
    bad = [(p, v) for p, v in numbers if not (math.isfinite(v) and (v > 0 or p.endswith(zero_ok)))]
    assert not bad, bad


def test_default_and_full_plans_cover_the_measured_grid():
    """The default run samples at the paper's main NFE settings; ``--full`` adds the B shape's
    calls at batch 32 and its end-to-end sampling at batch 16, and nothing else changes."""
    import run

    default, full = run.plan(quick=False), run.plan(quick=False, full=True)
    assert default["nfes"] == full["nfes"] == [16, 64, 128]
    calls = {s.name: bs for s, bs in default["call_shapes"]}
    assert calls == {"demo": [1, 8, 32], "elf-reg-b": [1, 8]}
    assert {s.name: bs for s, bs in full["call_shapes"]} == {"demo": [1, 8, 32], "elf-reg-b": [1, 8, 32]}
    assert {s.name: bs for s, bs, _ in default["e2e"]} == {"demo": [1, 16], "elf-reg-b": [1]}
    assert {s.name: bs for s, bs, _ in full["e2e"]} == {"demo": [1, 16], "elf-reg-b": [1, 16]}
    # the demo step is short enough to time in many rounds, and needs them for a stable median
    assert {s.name: fewest for s, fewest in default["train_shapes"]} == {"demo": 15, "elf-reg-b": 0}
    same = {k for k in default if k not in ("call_shapes", "e2e")}
    assert all(default[k] == full[k] for k in same)


def test_a_train_shape_is_timed_at_least_its_fewest_repeats(tmp_path):
    """A shape's fewest repeats raise the run's ``--repeats`` and never lower it, for the step
    and the optimiser timings alike (a subprocess: the run keeps freed memory process-wide)."""
    script = (
        "import sys; import run\n"
        "quick = run.plan(True)\n"
        "run.plan = lambda q, f=False: {**quick, 'train_shapes': [(run.TINY, 3), (run.TINY_WIDE, 1)]}\n"
        "r = run.main(['--quick', '--sections', 'train', '--repeats', '2', '--out', sys.argv[2]])\n"
        "print([(s['repeats'], s['optimizer_impls']['repeats']) for s in r['train']])\n")
    proc = subprocess.run([sys.executable, "-c", script, "", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(RUN.parent)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[(3, 3), (2, 2)]"


def test_quick_and_full_together_are_refused():
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--full"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--quick and --full are opposite plans" in proc.stderr


def test_host_memory_section_times_denoise_calls_in_a_process_per_setting():
    import run
    from perf.host_memory import host_memory_section

    sec = host_memory_section(run.TINY, "fp32", rounds=1, steps=2, denoise_batch=3)
    assert sec["denoise_batch"] == 3 and sec["steps"] == 2
    assert sec["keep"]["applied"] and not sec["release"]["applied"]
    assert set(sec["keep"]["phase_seconds"]) == {"step"}  # a call, not a training step's phases
    assert sec["release_over_keep"] == pytest.approx(sec["release"]["step_seconds"] / sec["keep"]["step_seconds"])
    assert all(sec[s]["step_seconds"] > 0 and sec[s]["peak_rss_bytes"] > 0 for s in ("release", "keep"))
