"""`elfreg demo --quick` end to end: real training and evaluation at CI size."""

import json
import math
from pathlib import Path

import pytest

from elfreg.cli import main
from elfreg.config import ConfigError
from elfreg.device import resolve_precision
from elfreg.toy.demo import DemoPlan, demo_config, token_match

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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


def test_plan_files_are_read_strictly(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("level: 2\nsteps: 40\nnfes: [4, 64]\ncanvas_len: 104\nprompt_cap: 48\n")
    plan = DemoPlan.from_file(path, out_dir="x")
    assert (plan.level, plan.steps, plan.nfes, plan.out_dir) == (2, 40, [4, 64], "x")
    cfg = demo_config(plan, "elf-reg")
    assert (cfg.data.toy_level, cfg.text.canvas_len, cfg.text.prompt_cap) == (2, 104, 48)
    for bad, key in (("stepz: 3\n", "stepz"), ("nfes: [4, x]\n", "nfes"), ("level: one\n", "level")):
        path.write_text(bad)
        with pytest.raises(ConfigError, match=key):
            DemoPlan.from_file(path)
    path.write_text("level: 3\n")
    with pytest.raises(ValueError, match="level"):
        DemoPlan.from_file(path)
    path.write_text("curve_points: -1\n")
    with pytest.raises(ValueError, match="curve_points"):
        DemoPlan.from_file(path)


def test_cli_step_override_is_checked(tmp_path):
    with pytest.raises(ValueError, match="steps"):
        main(["demo", "--quick", "--steps", "-5", "--out", str(tmp_path / "d"), "--no-progress"])
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("name", ["toy-study-level1.yaml", "toy-study-level2.yaml"])
def test_study_plans_load(name):
    plan = DemoPlan.from_file(CONFIGS / name)
    assert plan.compare and plan.curve_points > 0 and 16 in plan.nfes and 64 in plan.nfes


def test_demo_quick_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("ELFREG_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 0
    for name in ("results.json", "table.txt", "pass1_vs_nfe.png", "learning_curve.png"):
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
    assert report["precision"]["resolved"] == resolve_precision("cpu")
    assert (out / "table.txt").read_text().startswith(f"precision: {report['precision']['resolved']} (")
    curve = model["accuracy_curve"]
    assert [p["step"] for p in curve] == [75, 150]
    assert all(0 <= p["pass@1"] <= 1 for p in curve) and 0 < curve[0]["train_seconds"] < curve[1]["train_seconds"]
    # the trained student writes answers far closer to the gold ones than an untrained one
    assert max(r["token_match"] for r in rows) > model["untrained"]["token_match"] + 0.03
    # nothing was written outside the output and cache folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "demo"]
