"""`elfreg demo --quick` end to end: real training and evaluation at CI size."""

import json
import math

from elfreg.cli import main
from elfreg.demo import DemoPlan, demo_config, token_match


def test_token_match_counts_gold_positions():
    assert token_match([5, 6, 7, 0], [5, 6, 7, 0]) == 1.0
    assert token_match([5, 9], [5, 6, 7, 0]) == 0.25
    assert token_match([], [5, 0]) == 0.0


def test_demo_configs_differ_only_in_the_training_signals(tmp_path):
    plan = DemoPlan(out_dir=tmp_path)
    reg, elf = demo_config(plan, "elf-reg"), demo_config(plan, "elf")
    assert (reg.loss.repa, reg.loss.extra_token) == (True, "reg")
    assert (elf.loss.repa, elf.loss.extra_token) == (False, "none")
    assert reg.model == elf.model and reg.train.steps == elf.train.steps and reg.data == elf.data


def test_demo_quick_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("ELFREG_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 0
    for name in ("results.json", "table.txt", "pass1_vs_nfe.png"):
        assert (out / name).stat().st_size > 0
    report = json.loads((out / "results.json").read_text())
    model = report["models"]["elf-reg"]
    assert model["config"]["loss"]["extra_token"] == "reg"
    rows = model["results"]
    assert {r["sampler"] for r in rows} == {"early-stop", "full-span"}
    for r in rows + [model["untrained"]]:
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in r["per_seed"] + [r["mean"], r["token_match"]])
        assert r["nfe_used"] <= r["nfe"]
    assert math.isfinite(report["baselines"]["teacher_greedy"]["pass@1"])
    # the trained student writes answers far closer to the gold ones than an untrained one
    assert max(r["token_match"] for r in rows) > model["untrained"]["token_match"] + 0.03
    # nothing was written outside the output and cache folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "demo"]
