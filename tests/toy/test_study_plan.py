"""Study plans: strict reading, the resolved models and samplers, the cells and their ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elfreg.cli import main
from elfreg.config import Config, ConfigError
from elfreg.toy.study.plan import PlanFile, load_plan, resolve

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SMALL = {"base": {}, "models": ["elf", "elf-reg"], "train_seeds": [0, 1], "samplers": ["early-stop", "reg-off"],
         "nfes": [4, 16], "sample_seeds": [0]}


def write_plan(folder: Path, **changes) -> Path:
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump({**SMALL, **changes}))
    return path


def test_cells_of_a_small_plan_in_order_with_stable_ids(tmp_path):
    study = load_plan(write_plan(tmp_path))
    assert [c.id for c in study.train_cells()] == ["elf/t0", "elf-reg/t0", "elf/t1", "elf-reg/t1"]
    # REG off at inference is evaluated only where REG was trained
    assert [c.id for c in study.eval_cells()] == [
        "elf/t0/early-stop/nfe4/s0", "elf/t0/early-stop/nfe16/s0",
        "elf-reg/t0/early-stop/nfe4/s0", "elf-reg/t0/early-stop/nfe16/s0",
        "elf-reg/t0/reg-off/nfe4/s0", "elf-reg/t0/reg-off/nfe16/s0",
        "elf/t1/early-stop/nfe4/s0", "elf/t1/early-stop/nfe16/s0",
        "elf-reg/t1/early-stop/nfe4/s0", "elf-reg/t1/early-stop/nfe16/s0",
        "elf-reg/t1/reg-off/nfe4/s0", "elf-reg/t1/reg-off/nfe16/s0"]
    assert [c.id for c in study.eval_cells(study.train_cells()[0])] == [
        "elf/t0/early-stop/nfe4/s0", "elf/t0/early-stop/nfe16/s0"]
    # the identity is a function of what the cells are made of, not of where the plan lies
    other = tmp_path / "b"
    other.mkdir()
    assert load_plan(write_plan(other)).identity() == study.identity()
    assert load_plan(write_plan(other, sample_seeds=[0, 1])).identity() != study.identity()
    assert load_plan(write_plan(other), ["overrides={train.steps: 7}"]).identity() != study.identity()


def test_models_and_samplers_are_changes_to_the_base(tmp_path):
    plan = write_plan(tmp_path, models=["elf", "repa", "elf-reg", "olt", "shift1", "wide"],
                      model_defs={"wide": {"model": {"width": 96}, "model.repa": False}},
                      samplers=["full-span", "renoise-schedule", "reg-off", "es16"],
                      sampler_defs={"es16": {"sampler": "early-stop", "rho": 16}}, base={"model": {"width": 48}})
    study = load_plan(plan)
    switches = {n: (c.model.repa, c.model.extra_token, c.text.repa_shift, c.model.width)
                for n, c in study.models.items()}
    assert switches == {"elf": (False, "none", 0, 48), "repa": (True, "none", 0, 48), "elf-reg": (True, "reg", 0, 48),
                        "olt": (True, "learned", 0, 48), "shift1": (True, "reg", 1, 48),
                        "wide": (False, "reg", 0, 96)}
    cell = study.train_cells()[8]  # elf-reg/t1
    cfg = study.run_config(cell, tmp_path / "run", progress=False)
    assert (cfg.train.seed, cfg.train.out_dir, cfg.train.progress) == (1, str(tmp_path / "run"), False)
    cells = {c.id: c for c in study.eval_cells()}
    sc = study.sample_config(cells["elf-reg/t0/renoise-schedule/nfe16/s0"])
    assert (sc.sampler, sc.renoise_mode, sc.nfe, sc.reg) == ("renoise", "schedule", 16, True)
    assert not study.sample_config(cells["shift1/t1/reg-off/nfe4/s0"]).reg
    assert study.sample_config(cells["elf/t0/es16/nfe4/s0"]).rho == 16
    assert "elf/t0/reg-off/nfe4/s0" not in cells and "olt/t0/reg-off/nfe4/s0" not in cells


def test_the_shipped_plans_load():
    study = load_plan(CONFIGS / "study-toy-level1.yaml")
    assert study.plan.models == ["elf", "repa", "elf-reg", "olt", "shift1"]
    assert study.plan.train_seeds == [0, 1, 2] and study.plan.sample_seeds == [0, 1, 2]
    assert study.plan.nfes == [4, 8, 16, 32] and study.base.data.toy_level == 1
    assert {"early-stop", "full-span", "renoise", "renoise-schedule", "renoise-noise", "reg-off"} == set(
        study.plan.samplers)
    assert len(study.train_cells()) == 15 and len(study.eval_cells()) == 15 * 5 * 12 + 6 * 12
    level2 = load_plan(CONFIGS / "study-toy-level2.yaml")  # the multi-step grid: every sampler, NFE 4-64
    assert level2.base.data.toy_level == 2 and level2.base.train.steps == 8000 and level2.base.model.width == 96
    assert level2.plan.models == ["elf", "repa", "elf-reg"] and level2.plan.nfes == [4, 8, 16, 32, 64]
    assert level2.plan.samplers == study.plan.samplers and level2.plan.sample_seeds == [0, 1]
    assert len(level2.train_cells()) == 9 and len(level2.eval_cells()) == 9 * 5 * 5 * 2 + 3 * 5 * 2
    # each elf-reg and elf run distilled into 4-, 2- and 1-step students, each beside its teacher
    assert level2.plan.distill.models == ["elf-reg", "elf"] and level2.distill_steps == [4, 2, 1]
    assert len(level2.distilled_cells()) == 6 * 3 * 2 * 2 * 2  # runs × rounds × (teacher, student) × samplers × seeds
    distilling = level2.distill_config(level2.train_cells()[2], Path("d"), progress=False)
    assert (distilling.distill.teacher_steps, distilling.train.lr, distilling.train.seed) == ([2, 4, 8], 2e-4, 0)
    recipe = Config.load(CONFIGS / "toy-study-level2.yaml")  # what `elfreg demo --config` trains
    trained = {k: v for k, v in level2.models["elf-reg"].to_dict().items() if k != "eval"}
    assert trained == {k: v for k, v in recipe.to_dict().items() if k != "eval"}
    adamw = load_plan(CONFIGS / "study-toy-level2-adamw.yaml")  # the kept rows' grid
    assert adamw.base.data.toy_level == 2 and adamw.base.train.steps == 6000 and adamw.base.train.optimizer == "adamw"
    assert len(adamw.train_cells()) == 2 and len(adamw.eval_cells()) == 2 * 2 * 3 * 2
    assert study.base.train.steps == 5800 and study.base.model.width == 64
    earlier = load_plan(CONFIGS / "study-toy-level1-2400.yaml")  # the grid of the records' runs
    assert earlier.base.train.steps == 2400 and earlier.base.model.width == 128
    assert earlier.plan.samplers == study.plan.samplers and len(earlier.eval_cells()) == len(study.eval_cells())
    kept = load_plan(CONFIGS / "study-toy-level1-96-wide.yaml")  # the latest table's grid
    assert (kept.base.model.width, kept.base.train.lr, kept.base.data.toy_balance) == (96, 5e-3, "combination")
    assert [c.id for c in kept.eval_cells()] == [c.id for c in study.eval_cells()]
    sweeps = load_plan(CONFIGS / "study-toy-level1-sweeps.yaml")
    from elfreg.toy.study.plan import training_settings  # the sweeps train nothing that study has not
    assert training_settings(sweeps.to_dict())["elf-reg"] == training_settings(earlier.to_dict())["elf-reg"]
    cells = {c.id: sweeps.sample_config(c) for c in sweeps.eval_cells()}
    assert cells["elf-reg/t2/rho16/nfe8/s1"].rho == 16 and cells["elf-reg/t0/p0.25/nfe16/s0"].renoise_power == 0.25
    quick = load_plan(CONFIGS / "study-quick.yaml")
    assert quick.base.text.encoder == "toy-quick:encoder" and quick.base.eval.limit == 48


@pytest.mark.parametrize("changes, message", [
    ({"sampels": [0]}, "config error: sampels: unknown key (known: base, distill, model_defs,"),
    ({"samplers": ["early-stop", "ddim"]}, "config error: samplers[1]: unknown sampler 'ddim' (known: early-stop,"),
    ({"sampler_defs": {"x": {"sampler": "ddim"}}, "samplers": ["x"]},
     "config error: samplers.x: sampler: expected one of ['early-stop', 'full-span', 'renoise', 'adaptive', 'sde'], "
     "got 'ddim'"),
    ({"sampler_defs": {"x": {"nfe": 8}}, "samplers": ["x"]}, "config error: sampler_defs.x.nfe: the NFE is an axis"),
    ({"models": ["elf", "bert"]}, "config error: models[1]: unknown model 'bert'"),
    ({"model_defs": {"m": {"loss.repz": True}}, "models": ["m"]},
     "config error: models.m: loss.repz: unknown key (known: reg_weight, repa_weight)"),
    ({"model_defs": {"m": {"train.seed": 3}}, "models": ["m"]},
     "config error: models.m: train.seed is set by the study, not by one model"),
    ({"model_defs": {"elf": {}}}, "config error: model_defs.elf: is a built-in name; choose another"),
    ({"train_seeds": [0, 0]}, "config error: train_seeds: lists a value twice: [0, 0]"),
    ({"nfes": [1, 4]}, "config error: nfes: every NFE must be >= 2"),
    ({"nfes": "16"}, "config error: nfes: expected a list, got '16'"),
    ({"base": {"data": {"source": "toy-code"}}}, "config error: base.data.source: the study scores toy arithmetic"),
    ({"base": {"train": {"lr": "fast"}}}, "config error: base: train.lr: expected float, got 'fast'"),
])
def test_plan_errors_are_one_line_naming_the_key(tmp_path, capsys, changes, message):
    plan = write_plan(tmp_path, **changes)
    with pytest.raises(ConfigError) as err:
        load_plan(plan)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert main(["study", "--plan", str(plan), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().startswith(message)
    assert not (tmp_path / "out").exists()


def test_a_plan_without_axes_or_with_a_bad_base_file_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="models: must list at least one model"):
        resolve(PlanFile(samplers=["full-span"], nfes=[4]), tmp_path)
    plan = write_plan(tmp_path, base="missing.yaml")
    assert main(["study", "--plan", str(plan)]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_rows_match_sample_settings_across_added_fields():
    from dataclasses import asdict

    from elfreg.config import SampleConfig
    from elfreg.toy.study.plan import sample_settings_match

    now = SampleConfig(sampler="full-span", nfe=16)
    recorded = asdict(now)
    assert sample_settings_match(recorded, now)
    assert not sample_settings_match(recorded, now.replace(nfe=8))
    # a row made before a setting existed: it was made with the setting's default
    older = {k: v for k, v in recorded.items() if k != "rho"}
    assert sample_settings_match(older, now) and not sample_settings_match(older, now.replace(rho=16))
    assert not sample_settings_match({**recorded, "gone": 1}, now)  # a setting that no longer exists


def test_init_from_takes_each_cells_training_seed(tmp_path):
    defs = {"next": {"loss.repa": True, "loss.extra_token": "reg", "train.init_from": "first/elf-reg/t{train_seed}"}}
    study = load_plan(write_plan(tmp_path, models=["elf", "next"], model_defs=defs))
    inits = {c.id: study.run_config(c, tmp_path / c.id).train.init_from for c in study.train_cells()}
    assert inits == {"elf/t0": None, "next/t0": "first/elf-reg/t0", "elf/t1": None, "next/t1": "first/elf-reg/t1"}
    # the plan records the field, not one seed's path: every cell of the model is made the same way
    assert study.to_dict()["models"]["next"]["config"]["train"]["init_from"] == "first/elf-reg/t{train_seed}"
    defs["next"]["train.init_from"] = "first/{model}/t{train_seed}"
    with pytest.raises(ConfigError, match=r"models.next.train.init_from: the only field it may hold is \{train_seed\}"):
        load_plan(write_plan(tmp_path, models=["elf", "next"], model_defs=defs))
