"""The study table's arithmetic on hand-made rows: the spread over training seeds and the spread
over sampling seeds are measured apart."""

from __future__ import annotations

import math
import statistics

import pytest

from elfreg.toy.study.plan import PlanFile, resolve
from elfreg.toy.study.report import build_report, format_table, plot_pass1_vs_nfe, spreads, table_entries


def test_training_seed_spread_and_sampling_seed_spread_are_apart():
    # two models that sample very differently from seed to seed but were trained alike ...
    same_training = spreads({0: [0.0, 1.0], 1: [1.0, 0.0]})
    assert same_training["pass@1"] == 0.5 and same_training["train_seed_std"] == 0.0
    assert same_training["sample_seed_std"] == pytest.approx(math.sqrt(0.5))
    # ... and two that sample alike but came out differently from training
    same_sampling = spreads({0: [0.2, 0.2, 0.2], 1: [0.6, 0.6, 0.6]})
    assert same_sampling["pass@1"] == pytest.approx(0.4) and same_sampling["sample_seed_std"] == 0.0
    assert same_sampling["train_seed_std"] == pytest.approx(statistics.stdev([0.2, 0.6]))
    mixed = spreads({0: [0.5, 0.6, 0.7], 1: [0.2, 0.2, 0.2], 2: [0.3, 0.5, 0.4]})
    assert mixed["pass@1"] == pytest.approx((0.6 + 0.2 + 0.4) / 3)
    assert mixed["train_seed_std"] == pytest.approx(0.2)  # stdev of 0.6, 0.2, 0.4 (n − 1)
    assert mixed["sample_seed_std"] == pytest.approx((0.1 + 0.0 + 0.1) / 3)
    assert (mixed["n_train_seeds"], mixed["n_sample_seeds"]) == (3, 3)


def test_a_spread_over_one_seed_is_unknown():
    one = spreads({0: [0.25, 0.75]})
    assert one["pass@1"] == 0.5 and one["train_seed_std"] is None
    assert one["sample_seed_std"] == pytest.approx(math.sqrt(0.125))
    assert spreads({0: [0.5], 1: [0.7]})["sample_seed_std"] is None
    assert spreads({})["pass@1"] is None


def _rows(study, values):
    rows = {}
    for cell in study.eval_cells():
        value = values(cell)
        if value is not None:
            rows[cell.id] = {"cell": cell.id, "pass@1": value, "token_match": 0.5 + value / 2, "n_problems": 10}
    return rows


def test_table_from_rows_in_plan_order(tmp_path):
    study = resolve(PlanFile(models=["elf", "elf-reg"], train_seeds=[0, 1], samplers=["reg-off", "full-span"],
                             nfes=[4, 16], sample_seeds=[0, 1, 2]), tmp_path)
    # pass@1 = 0.1·nfe/4 + 0.1·training seed + 0.01·sampling seed
    rows = _rows(study, lambda c: 0.1 * c.nfe / 4 + 0.1 * c.train_seed + 0.01 * c.sample_seed)
    table = table_entries(study, rows)
    assert [(e["model"], e["sampler"], e["nfe"]) for e in table] == [
        ("elf", "full-span", 4), ("elf", "full-span", 16), ("elf-reg", "reg-off", 4), ("elf-reg", "reg-off", 16),
        ("elf-reg", "full-span", 4), ("elf-reg", "full-span", 16)]
    e = table[1]
    assert e["pass@1"] == pytest.approx(0.4 + 0.05 + 0.01)
    assert e["train_seed_std"] == pytest.approx(statistics.stdev([0.41, 0.51]))
    assert e["sample_seed_std"] == pytest.approx(0.01)
    assert e["complete"] and e["cells"] == 6 and e["token_match"] == pytest.approx(0.5 + e["pass@1"] / 2)
    report = build_report(study, rows, {c.id: tmp_path / c.id for c in study.train_cells()})
    assert report["complete"] and report["problems"]["n"] == 10 and len(report["rows"]) == 36
    text = format_table(report)
    assert "| elf | full-span | 16 | 46.0 | 7.1 | 1.0 | 73.0 | 2 × 3 |" in text.splitlines()
    # the same entry in the NFE-across view: one row per (model, sampler)
    assert "| elf | full-span | 16.0 (7.1, 1.0) | 46.0 (7.1, 1.0) |" in text.splitlines()
    bottom, top = plot_pass1_vs_nfe(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    # one shared y range that holds every model's highest point and its error bar
    assert bottom == 0 and top >= max(100 * (e["pass@1"] + e["train_seed_std"]) for e in table)


def test_an_incomplete_grid_says_so(tmp_path):
    study = resolve(PlanFile(models=["elf"], train_seeds=[0, 1], samplers=["early-stop"], nfes=[4],
                             sample_seeds=[0, 1]), tmp_path)
    rows = _rows(study, lambda c: None if (c.train_seed, c.sample_seed) == (1, 1) else 0.5)
    report = build_report(study, rows, {})
    (entry,) = report["table"]
    assert not entry["complete"] and entry["cells"] == 3 and not report["complete"]
    assert entry["sample_seed_std"] is None  # training seed 1 has one sampling seed so far
    line = "| elf | early-stop | 4 | 50.0 | 0.0 | n/a | 75.0 | 2 × 1 (incomplete) |"
    assert line in format_table(report).splitlines()
    assert "| elf | early-stop | 50.0 (0.0, n/a)* |" in format_table(report).splitlines()
