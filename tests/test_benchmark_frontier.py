"""benchmarks/frontier.py --quick: a tiny study and its AR baseline trained, read and timed together."""

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
    for batch in (1, 2):
        mine = {(r["model"], r["sampler"], r["nfe"]): r for r in rows if r["batch"] == batch}
        # every table entry of the study, the AR baseline and the teacher, at every batch size
        assert set(mine) == {(e["model"], e["sampler"], e["nfe"]) for e in study["table"]} | {
            ("ar", "greedy", None), ("teacher", "greedy", None)}
        for e in study["table"]:
            row = mine[(e["model"], e["sampler"], e["nfe"])]
            assert row["pass@1"] == e["pass@1"]  # read from the study, not sampled again
            assert row["calls"] == e["nfe"] and row["positions"] == e["nfe"] * 104  # every call reads the canvas
        assert mine[("ar", "greedy", None)]["pass@1"] == ar["pass@1_mean"]
        assert mine[("ar", "greedy", None)]["params"] == ar["runs"][0]["params"]
        assert all(r["seconds_per_problem"] > 0 for r in mine.values())
        # the AR model reads each position once: prompt plus one per generated token
        assert mine[("ar", "greedy", None)]["positions"] > mine[("ar", "greedy", None)]["calls"]
    summary = report["summary"]["1"]
    assert summary["best_pass@1"] == max(e["pass@1"] for e in study["table"])
    assert summary["speed_over_ar"] == summary["ar"]["seconds_per_problem"] / summary["fastest_within"][
        "seconds_per_problem"]
    assert (out / "frontier-batch1.png").stat().st_size > 0 and (out / "frontier-batch2.png").exists()
    tables = (out / "frontier.md").read_text()
    assert "### Batch 16" not in tables and "### Batch 2" in tables
