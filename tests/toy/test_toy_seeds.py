"""`elfreg demo --seeds`: the spread of one recipe over training seeds, and its figure."""

import json
import math

import pytest

from elfreg.cli import main
from elfreg.toy import seeds as seeds_module
from elfreg.toy.demo import demo_config
from elfreg.toy.report import plot_seed_curves
from elfreg.toy.seeds import format_spread, parse_seeds, seed_config, seed_curves, spread


def fake_report(values: dict[tuple[str, int], float], curve_end: float = 0.5) -> dict:
    """A demo report with one model whose (sampler, NFE) cells score ``values``."""
    metrics = [{"step": s, "denoise": 1.0 / s, "decode": 2.0 / s, "lr": 1e-3} for s in (10, 20, 30)]
    metrics.insert(1, {"step": 15, "lr": 1e-3})  # a row without losses is left out of the curves
    return {"models": {"elf-reg": {
        "results": [{"sampler": sampler, "nfe": nfe, "mean": v} for (sampler, nfe), v in values.items()],
        "learning_curve": metrics, "accuracy_curve": [{"step": 30, "pass@1": curve_end}]}},
        "total_seconds": 1.0}


def test_spread_is_taken_over_the_runs_of_each_cell():
    reports = {1: fake_report({("early-stop", 16): 0.80, ("full-span", 16): 0.50}),
               2: fake_report({("early-stop", 16): 0.90, ("full-span", 16): 0.50}),
               5: fake_report({("early-stop", 16): 0.70, ("full-span", 16): 0.50})}
    rows = spread(reports)
    assert [(r["sampler"], r["nfe"]) for r in rows] == [("early-stop", 16), ("full-span", 16)]
    es = rows[0]
    assert es["per_seed"] == {1: 0.80, 2: 0.90, 5: 0.70}
    assert math.isclose(es["mean"], 0.80) and math.isclose(es["std"], 0.10)
    assert (es["min"], es["max"]) == (0.70, 0.90) and math.isclose(es["span"], 0.20)
    assert rows[1]["std"] == 0.0 and rows[1]["span"] == 0.0
    table = format_spread(rows)
    assert "seed 5" in table and "80.0" in table and " 20.0" in table.splitlines()[1]


def test_one_run_has_no_spread_and_runs_measured_differently_are_refused():
    assert spread({3: fake_report({("early-stop", 4): 0.4})})[0]["std"] == 0.0
    with pytest.raises(ValueError, match="training seed 2 was measured on other cells"):
        spread({1: fake_report({("early-stop", 16): 0.8}), 2: fake_report({("early-stop", 8): 0.8})})


def test_seed_config_changes_the_training_seed_only():
    cfg = demo_config(quick=True)
    moved = seed_config(cfg, 7)
    assert moved.train.seed == 7
    assert moved.to_dict() == {**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "seed": 7}}


def test_seed_curves_keep_the_loss_rows_and_the_accuracy_points():
    curves = seed_curves({4: fake_report({("early-stop", 16): 0.8}, curve_end=0.75)}, "elf-reg")
    assert curves[4]["step"] == [10, 20, 30]
    assert curves[4]["denoise"] == [0.1, 0.05, 1 / 30] and curves[4]["decode"] == [0.2, 0.1, 2 / 30]
    assert curves[4]["accuracy"] == [(30, 0.75)]


def test_run_seeds_trains_each_seed_into_its_own_folder(tmp_path, monkeypatch):
    calls = []

    def fake_run_demo(cfg, out_dir, compare=False, progress=True):
        calls.append((cfg.train.seed, out_dir))
        return fake_report({("early-stop", 16): 0.5 + cfg.train.seed / 10})

    monkeypatch.setattr("elfreg.toy.demo.run_demo", fake_run_demo)
    out = tmp_path / "spread"
    summary = seeds_module.run_seeds(demo_config(quick=True), out, [1, 3])
    assert calls == [(1, out / "seed-1"), (3, out / "seed-3")]
    written = json.loads((out / "seeds.json").read_text())
    assert written["seeds"] == [1, 3] and written["config"]["train"]["seed"] == 0
    assert written["rows"][0]["per_seed"] == {"1": 0.6, "3": 0.8}
    assert math.isclose(summary["rows"][0]["span"], 0.2)
    assert (out / "seed_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "seeds.txt").read_text().startswith("model")
    with pytest.raises(ValueError, match="distinct"):
        seeds_module.run_seeds(demo_config(quick=True), out, [1, 1])


def test_a_finished_seed_is_reused_only_while_it_measured_what_is_asked(tmp_path, monkeypatch):
    """A seed folder whose results.json reports the asked settings and the run's newest checkpoint
    is not evaluated again; other evaluation settings, more steps, another seed's settings, a
    checkpoint newer than the report, or a cut results.json make the seed run again."""
    cfg = demo_config(quick=True)
    out, calls = tmp_path / "spread", []
    folder = out / "seed-1"
    (folder / "elf-reg" / "checkpoints" / "step-0000010").mkdir(parents=True)

    def fake_run_demo(run_cfg, out_dir, compare=False, progress=True):
        calls.append(run_cfg.train.seed)
        report = {**fake_report({("early-stop", 16): 0.5}), "config": run_cfg.to_dict(), "compare": compare}
        report["models"]["elf-reg"]["checkpoint"] = str(out_dir / "elf-reg" / "checkpoints" / "step-0000010")
        out_dir.mkdir(exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(report))
        return report

    monkeypatch.setattr("elfreg.toy.demo.run_demo", fake_run_demo)
    monkeypatch.setattr("elfreg.checkpoint.resolve_checkpoint",
                        lambda run: max((run / "checkpoints").iterdir(), default=None))
    seeds_module.run_seeds(cfg, out, [1])
    assert calls == [1]
    first = json.loads((out / "seeds.json").read_text())
    seeds_module.run_seeds(cfg, out, [1])  # the same command again: nothing to run
    assert calls == [1] and json.loads((out / "seeds.json").read_text())["rows"] == first["rows"]
    seeds_module.run_seeds(cfg, out, [1, 2])  # a seed added: only it runs
    assert calls == [1, 2]
    for changed in ("eval.nfes=4", "train.steps=999", "sample.sc_cfg=2.5"):
        seeds_module.run_seeds(demo_config(quick=True, overrides=[changed]), out, [1])
        assert calls[-1] == 1 and len(calls) == 3, changed
        calls.pop()
        seeds_module.run_seeds(cfg, out, [1])  # the report of the base settings again
        calls.pop()
    assert seeds_module.finished_report(seed_config(cfg, 1), folder, compare=True) is None
    assert seeds_module.finished_report(seed_config(cfg, 2), folder, compare=False) is None  # train.seed
    assert seeds_module.finished_report(seed_config(cfg, 1), folder, compare=False) is not None
    (folder / "elf-reg" / "checkpoints" / "step-0000020").mkdir()  # trained on since the report
    assert seeds_module.finished_report(seed_config(cfg, 1), folder, compare=False) is None
    (folder / "elf-reg" / "checkpoints" / "step-0000020").rmdir()
    (folder / "results.json").write_text((folder / "results.json").read_text()[:50])  # cut by a kill
    assert seeds_module.finished_report(seed_config(cfg, 1), folder, compare=False) is None


def test_the_seed_figure_has_a_panel_per_loss_and_one_for_accuracy_when_measured(tmp_path):
    reports = {1: fake_report({("early-stop", 16): 0.8}), 2: fake_report({("early-stop", 16): 0.7})}
    titles = plot_seed_curves({"elf-reg": seed_curves(reports, "elf-reg")}, tmp_path / "a.png")
    assert titles == ["denoise loss", "decode loss", "held-out pass@1 (%), early-stop 16 NFE"]
    for report in reports.values():
        report["models"]["elf-reg"]["accuracy_curve"] = []
    assert plot_seed_curves({"elf-reg": seed_curves(reports, "elf-reg")}, tmp_path / "b.png") == [
        "denoise loss", "decode loss"]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seed_lists_read_ranges_and_refuse_what_is_not_a_list_of_seeds():
    assert parse_seeds("1-5") == [1, 2, 3, 4, 5]
    assert parse_seeds("0, 2,7") == [0, 2, 7] and parse_seeds("1-3,9") == [1, 2, 3, 9]
    for bad, why in [("3-1", "backwards"), ("1,x", "not a seed"), ("1-3,2", "twice"), ("-2", "not a seed"),
                     ("", "not a seed")]:
        with pytest.raises(ValueError, match=why):
            parse_seeds(bad)


def test_seeds_and_a_seed_override_are_refused_together(tmp_path, capsys):
    assert main(["demo", "--quick", "--seeds", "1,2", "train.seed=3", "--out", str(tmp_path / "d"),
                 "--no-progress"]) == 2
    assert "--seeds and a train.seed= override" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
