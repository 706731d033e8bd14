"""`elfreg demo --quick` end to end: real training and evaluation at CI size."""

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from elfreg.cli import main
from elfreg.config import Config, ConfigError
from elfreg.device import resolve_precision
from elfreg.toy import arith
from elfreg.toy.demo import DEMO, demo_config, error_shares, token_match, variant_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_token_match_counts_gold_positions():
    assert token_match([5, 6, 7, 0], [5, 6, 7, 0]) == 1.0
    assert token_match([5, 9], [5, 6, 7, 0]) == 0.25
    assert token_match([], [5, 0]) == 0.0


def test_error_shares_are_shares_of_the_wrong_answers():
    assert error_shares([None, "off by one", "off by one", "other", None]) == {"off by one": 2 / 3, "other": 1 / 3}
    assert error_shares([None, None]) == {}
    assert list(error_shares(["other", "no answer"])) == ["no answer", "other"]  # in ERROR_KINDS order


def test_demo_variants_differ_only_in_the_training_signals(tmp_path):
    cfg = demo_config()
    reg, elf = variant_config(cfg, "elf-reg", tmp_path), variant_config(cfg, "elf", tmp_path)
    assert (reg.model.repa, reg.model.extra_token) == (True, "reg")
    assert (elf.model.repa, elf.model.extra_token) == (False, "none") and not elf.needs_teacher
    assert replace(reg.model, repa=False, extra_token="none") == elf.model
    assert reg.train.steps == elf.train.steps and reg.data == elf.data
    assert (reg.train.out_dir, elf.train.out_dir) == (str(tmp_path / "elf-reg"), str(tmp_path / "elf"))


def test_the_default_demo_is_the_documented_budget():
    cfg = demo_config()
    assert (cfg.model.width, cfg.model.depth, cfg.train.steps, cfg.train.batch_size) == (64, 4, 5800, 32)
    assert cfg.model.projector_hidden == 2 * cfg.model.width  # the REPA projector scales with the student
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.weight_decay) == ("muon", 1e-2, 0.2)
    assert (cfg.data.toy_level, cfg.data.toy_balance) == (1, "tens")
    assert [s.nfe for s in cfg.eval.grid(cfg.sample)] == [4, 8, 16, 4, 8, 16]
    assert (cfg.flow.w_min, cfg.flow.w_max, cfg.sample.sc_cfg) == (0.5, 2.0, 1.0)  # see docs/demo.md
    quick = demo_config(quick=True)
    assert quick.text.encoder == "toy-quick:encoder" and quick.eval.limit == 48 and quick.train.steps == 150
    assert (quick.train.optimizer, quick.train.weight_decay) == ("adamw", 0.0)
    assert (quick.model.width, quick.model.projector_hidden) == (96, 192)  # see QUICK


def test_demo_settings_are_a_strict_run_config(tmp_path):
    cfg = demo_config(overrides=["data.toy_level=2", "data.toy_balance=combination", "eval.nfes=[4,64]",
                                 "text.canvas_len=104"])
    assert (cfg.data.toy_level, cfg.eval.nfes, cfg.text.canvas_len) == (2, [4, 64], 104)
    # the default's tens balance is a one-step setting: multi-step problems must say so
    with pytest.raises(ConfigError, match="data.toy_balance: .*set it to combination"):
        demo_config(overrides=["data.toy_level=2"])
    for bad, key in (("eval.nfez=[4]", "eval.nfez"), ("eval.nfes=[4,x]", "eval.nfes"),
                     ("eval.nfes=[1]", "eval.nfes"), ("eval.curve_points=-1", "eval.curve_points"),
                     ("eval.samplers=[ddim]", "eval.samplers"), ("train.steps=-5", "train.steps")):
        with pytest.raises(ConfigError, match=key):
            demo_config(overrides=[bad])
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps({**DEMO, "eval": {"split": "tuning"}}))
    with pytest.raises(ConfigError, match="eval.split"):
        demo_config(path=str(path))


def test_cli_overrides_are_checked_before_anything_is_written(tmp_path, capsys):
    assert main(["demo", "--quick", "train.steps=-5", "--out", str(tmp_path / "d"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == "config error: train.steps: must be >= 1"
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("name", ["toy-study-level1.yaml", "toy-study-level2.yaml"])
def test_study_configs_load(name):
    cfg = Config.load(CONFIGS / name)
    assert cfg.eval.curve_points > 0 and 16 in cfg.eval.nfes and 64 in cfg.eval.nfes
    assert cfg.text.encoder == "toy:encoder" and cfg.data.source == "toy-arith"


def test_the_one_step_study_trains_the_demos_recipe():
    """The study's claims are about the recipe the demo trains: every setting but the evaluation's
    is the demo's (a change to one must be made to both)."""
    study, demo = Config.load(CONFIGS / "toy-study-level1.yaml").to_dict(), demo_config().to_dict()
    for section in ("text", "model", "flow", "loss", "data", "train", "sample"):
        assert study[section] == demo[section], section
    assert study["eval"]["samples"] == 3 and study["eval"]["curve_points"] == 8


def test_the_kept_study_recipe_changes_only_what_it_names():
    """configs/toy-study-level1-96-wide.yaml, the recipe of the latest study table, is today's study
    config with six recipe settings changed (docs/demo.md compares the two), and trained without
    compiling, as its runs were: every other setting, the evaluation's included, is today's."""
    changed = {("model", "width"): 96, ("model", "projector_hidden"): 192, ("train", "steps"): 4000,
               ("train", "lr"): 5e-3, ("train", "weight_decay"): 0.4, ("data", "toy_balance"): "combination",
               ("train", "compile"): False}
    kept, today = (Config.load(CONFIGS / name).to_dict()
                   for name in ("toy-study-level1-96-wide.yaml", "toy-study-level1.yaml"))
    for (section, key), value in changed.items():
        assert kept[section][key] == value and today[section][key] != value, (section, key)
        del kept[section][key], today[section][key]
    assert kept == today


def test_demo_quick_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("ELFREG_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 0
    for name in ("results.json", "table.txt", "pass1_vs_nfe.png", "learning_curve.png"):
        assert (out / name).stat().st_size > 0
    report = json.loads((out / "results.json").read_text())
    model = report["models"]["elf-reg"]
    assert model["config"]["model"]["extra_token"] == "reg"
    rows = model["results"]
    assert [(r["sampler"], r["nfe"]) for r in rows] == [("early-stop", 4), ("early-stop", 16),
                                                        ("full-span", 4), ("full-span", 16)]
    for r in rows + [model["untrained"]]:
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in r["per_seed"] + [r["mean"], r["token_match"]])
        assert r["nfe_used"] <= r["nfe"]
    for r in rows:  # pass@1 ± the sample std (n − 1) over the two sampling seeds
        a, b = r["per_seed"]
        assert r["mean"] == pytest.approx((a + b) / 2) and r["std"] == pytest.approx(abs(a - b) / math.sqrt(2))
    assert len(model["untrained"]["per_seed"]) == 1  # the untrained student: one sampling seed
    # the seen combinations: as many training-split problems as held-out ones (48), one seed; the
    # kinds of wrong answers are shares of the wrong ones
    seen = model["seen"]
    assert len(seen["per_seed"]) == 1 and 0 <= seen["mean"] <= 1 and seen["problems"] == 48
    assert (seen["sampler"], seen["nfe"]) == ("early-stop", 16)
    for r in rows + [seen]:
        assert set(r["errors"]) <= set(arith.ERROR_KINDS)
        assert sum(r["errors"].values()) == pytest.approx(1.0) if r["mean"] < 1 else r["errors"] == {}
    table = (out / "table.txt").read_text()
    assert f"seen combinations (training problems, early-stop 16 NFE, seed 0): {100 * seen['mean']:.1f}%" in table
    assert math.isfinite(report["baselines"]["teacher_greedy"]["pass@1"])
    assert report["precision"]["resolved"] == resolve_precision("cpu") and report["precision"]["device"] == "cpu"
    assert (out / "table.txt").read_text().startswith(f"precision: {report['precision']['resolved']} on cpu (")
    curve = model["accuracy_curve"]
    assert [p["step"] for p in curve] == [75, 150]
    assert all(0 <= p["pass@1"] <= 1 for p in curve) and 0 < curve[0]["train_seconds"] < curve[1]["train_seconds"]
    # the trained student writes answers far closer to the gold ones than an untrained one
    assert max(r["token_match"] for r in rows) > model["untrained"]["token_match"] + 0.03
    # nothing was written outside the output and cache folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "demo"]
    # the trajectory analysis runs on the quick demo's checkpoint (its metrics are checked against
    # hand-computed values in tests/analysis)
    analysis = tmp_path / "analysis"
    assert main(["analyze", "trajectory", "--checkpoint", str(out / "elf-reg"), "--task", "gsm8k", "--split", "test",
                 "--limit", "3", "--master", "16", "--nfes", "4,8", "--seeds", "0", "--acceleration", "5",
                 "--observe-every", "2", "--out", str(analysis), "--no-progress"]) == 0
    table = json.loads((analysis / "table11.json").read_text())
    per_nfe = {e["nfe"]: e for e in table["per_nfe"]}
    pairs = [json.loads(line) for line in (analysis / "rows.jsonl").read_text().splitlines()]
    assert table["pairs"] == len(pairs) == 3 and sorted(per_nfe) == [4, 8, 16]
    for n in (4, 8):  # the trained student's early readouts against its endpoint, pair by pair
        cells = [p["nfe"][str(n)] for p in pairs]
        assert per_nfe[n]["exact_agreement"] == pytest.approx(sum(c["exact"] for c in cells) / 3)
        assert per_nfe[n]["answer_agreement"] == pytest.approx(sum(c["answer_agree"] for c in cells) / 3)
        assert all(c["answer_agree"] for c in cells if c["exact"])  # the same text has the same answer
    # benchmarks/sc_cfg_sweep.py scores the checkpoint at each w on the validation split
    import sc_cfg_sweep

    sweep = tmp_path / "sweep.json"
    monkeypatch.setattr(sys, "argv", ["sc_cfg_sweep.py", "--run", str(out / "elf-reg"), "--ws", "1", "2", "--nfes", "4",
                                      "--seeds", "1", "--limit", "8", "--out", str(sweep)])
    sc_cfg_sweep.main()
    swept = json.loads(sweep.read_text())
    assert swept["split"] == "valid" and swept["n_problems"] == 8 and [r["sc_cfg"] for r in swept["rows"]] == [1, 2]
    assert all(0 <= r["mean"] <= 1 and r["nfe_used"] <= 4 for r in swept["rows"])
    # configs/tiny.yaml, the README's first training run, trains on the same (cached) toy LMs: run
    # for 30 steps instead of its 150 (a fifth of the time), both losses already fall by a fifth
    tiny = tmp_path / "tiny"
    assert main(["train", "--config", str(CONFIGS / "tiny.yaml"), f"train.out_dir={tiny}",
                 "train.progress=false", "train.steps=30"]) == 0
    lines = [json.loads(line) for line in (tiny / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 30 and (tiny / "checkpoints" / "step-0000030").is_dir()
    assert lines[-1]["denoise"] < lines[0]["denoise"] and lines[-1]["total"] < lines[0]["total"]


def test_the_precision_line_names_the_students_device_and_precision(monkeypatch):
    """On a GPU the student trains in bf16 while the toy LMs are built on the CPU in fp32: the
    report says both, not the CPU rule alone."""
    from elfreg.toy import demo
    from elfreg.toy.report import format_table

    monkeypatch.delenv("ELFREG_PRECISION", raising=False)
    monkeypatch.setattr(demo, "resolve_device", lambda name: torch.device("cuda"))
    prec = demo.precision_report(Config())
    assert (prec["resolved"], prec["device"], prec["toy_lms"]) == ("bf16", "cuda", "fp32")
    report = {"precision": prec, "config": Config().to_dict(), "n_test_problems": 1, "models": {},
              "baselines": {"most_frequent_answer": {"answer": "1", "pass@1": 0.0},
                            "teacher_greedy": {"pass@1": 0.0}, "encoder_lm_greedy": {"pass@1": 0.0}},
              "asset_report": {"encoder": {"digit_readout": {str(Config().text.encoder_layer): 0.5}}}}
    first = format_table(report).splitlines()[0]
    assert first.startswith("precision: bf16 on cuda (precision: auto, bf16 on CUDA; toy LMs built on the CPU in fp32")
    assert "student blocks trained eager);" in first
    report["config"]["train"]["compile"] = True
    assert "student blocks trained compiled);" in format_table(report).splitlines()[0]


def test_curve_point_cut_off_while_scored_is_scored_on_resume(tmp_path, monkeypatch):
    """A kill while a held-out curve point is scored loses neither the point nor its training
    seconds: the resume scores that stop's own checkpoint before training any further."""
    from elfreg.toy import demo

    cfg = demo_config(overrides=["train.steps=100", "eval.curve_points=2", f"train.out_dir={tmp_path / 'run'}"])
    trained, saved = [], []  # each train() call's stop, the steps with a checkpoint

    class Checkpoint:  # stands for a run's checkpoint folder step-N
        def __init__(self, path):
            self.meta = {"step": int(Path(path).name.removeprefix("step-"))}

        def load_student(self, use_ema):
            return self.meta["step"]

    def train(cfg, stop_at):
        Path(cfg.train.out_dir).mkdir(exist_ok=True)
        trained.append(stop_at)
        saved.append(stop_at)

    cut = {"once": True}

    def evaluate(student, frozen, problems, cfg, sample, samples, progress, seed=0):
        if cut.pop("once", False):
            raise KeyboardInterrupt
        return {"mean": student / 1000}  # names the checkpoint it scored

    monkeypatch.setattr(demo, "train", train)
    monkeypatch.setattr(demo, "evaluate", evaluate)
    monkeypatch.setattr(demo, "open_checkpoint", Checkpoint)
    monkeypatch.setattr(demo, "resolve_checkpoint",
                        lambda run: Path(run) / f"step-{saved[-1]:07d}" if saved else None)
    monkeypatch.setattr(demo, "load_frozen_text", lambda *args, **kwargs: None)
    with pytest.raises(KeyboardInterrupt):  # killed while scoring the point at step 50
        demo.train_variant(cfg, problems=[])
    pending = json.loads((tmp_path / "run" / "accuracy_curve.pending.json").read_text())
    assert trained == [50] and pending["step"] == 50 and pending["train_seconds"] >= 0
    curve = demo.train_variant(cfg, problems=[])
    assert trained == [50, 100]  # step 50 was not trained again
    assert [(p["step"], p["pass@1"]) for p in curve] == [(50, 0.05), (100, 0.1)]
    assert curve[0]["train_seconds"] == pending["train_seconds"] <= curve[1]["train_seconds"]
    assert not (tmp_path / "run" / "accuracy_curve.pending.json").exists()
    assert demo.train_variant(cfg, problems=[]) == curve and trained == [50, 100]  # a finished run: nothing
