"""benchmarks/frontier.py --quick: a tiny study, its distilled students and its AR baseline trained, read and
timed together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_quick_frontier_reads_the_study_and_ar_results_and_times_every_point(tmp_path):
    out = tmp_path / "frontier"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "frontier.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "frontier.json").read_text())
    rows = report["rows"]
    study = json.loads((out / "quick-inputs" / "study" / "results.json").read_text())
    ar = json.loads((out / "quick-inputs" / "ar" / "results.json").read_text())
    # the distilled table: the 2- and 1-step students, and their teachers where the grid has no
    # entry (elf-reg early-stop at NFE 2 is the grid's own)
    distilled = {(e["model"] + ("-distilled" if e["student"] == "distilled" else ""), e["sampler"], e["nfe"]): e
                 for e in study["distilled"]}
    assert set(distilled) == {("elf-reg-distilled", s, n) for s in ("round", "early-stop") for n in (3, 2)} | {
        ("elf-reg", "round", 3), ("elf-reg", "early-stop", 3), ("elf-reg", "round", 2), ("elf-reg", "early-stop", 2)}
    grid = {(e["model"], e["sampler"], e["nfe"]): e for e in study["table"]}
    assert ("elf-reg", "early-stop", 2) in grid
    for batch in (1, 2):
        mine = {(r["model"], r["sampler"], r["nfe"]): r for r in rows if r["batch"] == batch}
        # every table entry of the study and its distillation, the AR baseline and the teacher, at every batch size
        assert len(mine) == len([r for r in rows if r["batch"] == batch])
        assert set(mine) == set(grid) | set(distilled) | {("ar", "greedy", None), ("teacher", "greedy", None)}
        for key, e in {**distilled, **grid}.items():
            row = mine[key]
            assert row["pass@1"] == e["pass@1"]  # read from the study, not sampled again
            assert row["calls"] == e["nfe"] and row["positions"] == e["nfe"] * 104  # every call reads the canvas
        assert mine[("elf-reg-distilled", "round", 2)]["distilled_steps"] == 1
        assert mine[("ar", "greedy", None)]["pass@1"] == ar["pass@1_mean"]
        assert mine[("ar", "greedy", None)]["params"] == ar["runs"][0]["params"]
        assert all(r["seconds_per_problem"] > 0 for r in mine.values())
        # the AR model reads each position once: prompt plus one per generated token
        assert mine[("ar", "greedy", None)]["positions"] > mine[("ar", "greedy", None)]["calls"]
    summary = report["summary"]["elf-reg"]["1"]
    assert summary["best_pass@1"] == max(r["pass@1"] for r in rows if r["model"] == "elf-reg")
    assert report["summary"]["elf-reg-distilled"]["2"]["best_pass@1"] == max(
        e["pass@1"] for e in study["distilled"] if e["student"] == "distilled")
    assert summary["speed_over_ar"] == summary["ar"]["seconds_per_problem"] / summary["fastest_within"][
        "seconds_per_problem"]
    assert (out / "frontier-batch1.png").stat().st_size > 0 and (out / "frontier-batch2.png").exists()
    tables = (out / "frontier.md").read_text()
    assert "### Batch 16" not in tables and "### Batch 2" in tables
