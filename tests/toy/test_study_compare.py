"""Per-training-run comparisons of study arms, on hand-made rows with known differences."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import yaml

from elfreg.cli import main
from elfreg.config import ConfigError
from elfreg.toy.study.compare import compare_arms, format_comparison, parse_arm, verdict
from elfreg.toy.study.plan import PlanFile, load_plan, resolve
from elfreg.toy.study.runner import ROWS_FILE, claim_folder

PLAN = {"base": {}, "models": ["elf", "elf-reg"], "train_seeds": [0, 1, 2],
        "samplers": ["early-stop", "full-span", "reg-off"], "nfes": [4, 16], "sample_seeds": [0, 1]}


def value(cell) -> float:
    """elf: 0.40 everywhere; elf-reg: 0.50 (+0.02 per sampling seed), except run 2 at full-span
    NFE 16, where it is 0.27; reg-off sits 0.01 under early-stop."""
    if cell.model == "elf":
        return 0.40
    if (cell.train_seed, cell.sampler, cell.nfe) == (2, "full-span", 16):
        return 0.27
    return 0.50 + 0.02 * cell.sample_seed - (0.01 if cell.sampler == "reg-off" else 0.0)


def rows_for(study) -> list[dict]:
    return [{"cell": c.id, "model": c.model, "train_seed": c.train_seed, "sampler": c.sampler, "nfe": c.nfe,
             "sample_seed": c.sample_seed, "pass@1": value(c), "token_match": 0.5, "n_problems": 10,
             "sample": asdict(study.sample_config(c))} for c in study.eval_cells()]


@pytest.fixture
def study(tmp_path):
    return resolve(PlanFile(**PLAN), tmp_path)


def test_two_models_are_compared_run_by_run_over_the_cells_they_share(study):
    c = compare_arms(rows_for(study), parse_arm("elf-reg", study), parse_arm("elf", study))
    assert [r["train_seed"] for r in c["runs"]] == [0, 1, 2]
    run0, _, run2 = c["runs"]
    # elf has no reg-off: the shared cells are early-stop and full-span at NFE 4 and 16
    assert run0["cells"] == 4 and set(run0["diffs"]) == {"early-stop/4", "early-stop/16", "full-span/4", "full-span/16"}
    assert run0["ahead"] == 4 and run0["mean"] == pytest.approx(0.11)  # 0.51 (mean over sampling seeds) − 0.40
    assert run2["ahead"] == 3 and run2["behind"] == 1
    assert run2["min"] == pytest.approx(-0.13) and run2["max"] == pytest.approx(0.11)
    assert run2["mean"] == pytest.approx((3 * 0.11 - 0.13) / 4)
    assert c["verdict"] == "elf-reg ahead in all 3 runs"  # not in every cell: run 2 has one behind
    text = format_comparison(c)
    assert "  run t2: ahead in 3 of 4 cells, -13.0 to +11.0, mean +5.0 (early-stop/4 +11.0," in text
    assert text.endswith("verdict: elf-reg ahead in all 3 runs")


def test_two_samplers_of_one_model_are_compared_nfe_by_nfe(study):
    c = compare_arms(rows_for(study), parse_arm("elf-reg/reg-off", study), parse_arm("elf-reg/early-stop", study))
    assert all(r["cells"] == 2 and set(r["diffs"]) == {"4", "16"} for r in c["runs"])
    assert all(d == pytest.approx(-0.01) for r in c["runs"] for d in r["diffs"].values())
    assert c["verdict"] == "elf-reg/early-stop ahead in all 3 runs, in every cell"


def test_runs_that_disagree_and_a_single_run_are_said_so():
    up = {"mean": 0.1, "ahead": 1, "behind": 0, "cells": 1}
    down = {"mean": -0.1, "ahead": 0, "behind": 1, "cells": 1}
    assert verdict("a", "b", [up, down]) == "neither arm is ahead in every run"
    assert verdict("a", "b", [up]).startswith("one training run")
    assert verdict("a", "b", []).startswith("no training run")
    assert verdict("a", "b", [up, {**up, "mean": 0.0, "ahead": 0}]) == "neither arm is ahead in every run"  # a tie
    assert verdict("a", "b", [down, down]) == "b ahead in all 2 runs, in every cell"


def test_arms_are_checked_against_the_plan(study):
    with pytest.raises(ConfigError, match="unknown model 'olt'"):
        parse_arm("olt", study)
    with pytest.raises(ConfigError, match="model 'elf' has no sampler 'reg-off'"):
        parse_arm("elf/reg-off", study)  # REG off applies only to models with REG
    with pytest.raises(ConfigError, match="not one of each"):
        compare_arms([], parse_arm("elf", study), parse_arm("elf-reg/early-stop", study))


def test_the_command_prints_comparisons_of_a_study_folder(tmp_path, capsys):
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(PLAN))
    study, out = load_plan(plan_path), tmp_path / "out"
    claim_folder(study, out)
    (out / ROWS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows_for(study)))
    args = ["study", "--plan", str(plan_path), "--out", str(out), "--compare", "elf-reg", "elf",
            "--compare", "elf-reg/reg-off", "elf-reg/early-stop"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| model |" not in printed  # --compare alone prints only the comparisons
    assert "verdict: elf-reg ahead in all 3 runs" in printed
    assert "verdict: elf-reg/early-stop ahead in all 3 runs, in every cell" in printed
    assert main([*args, "--report-to", str(tmp_path / "report")]) == 0
    saved = json.loads((tmp_path / "report" / "comparisons.json").read_text())
    assert [c["a"] for c in saved] == ["elf-reg", "elf-reg/reg-off"] and "| model |" in capsys.readouterr().out
    assert main(["study", "--plan", str(plan_path), "--out", str(out), "--compare", "elf", "shift1"]) == 2
    assert "unknown model 'shift1'" in capsys.readouterr().err


def test_cells_equal_up_to_float_rounding_are_level():
    # one pass@1 reached by two float paths (0.1 + 0.2 != 0.3 in its last bit), one sampling seed
    rows = [{"model": m, "train_seed": t, "sampler": "early-stop", "nfe": 4, "pass@1": v}
            for t in (0, 1) for m, v in (("x", 0.1 + 0.2), ("y", 0.3))]
    c = compare_arms(rows, ("x", "early-stop"), ("y", "early-stop"))
    assert all(r["ahead"] == r["behind"] == 0 for r in c["runs"])
    assert c["verdict"] == "neither arm is ahead in every run"  # level in both runs
