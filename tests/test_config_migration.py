"""Configs of earlier versions: the student's REPA projector and extra token moved from ``loss`` to
``model``, and one migration reads the old place everywhere. ``tests/fixtures/
run_before_model_settings`` is a run folder written by elfreg before the move (commit cbb7634):
its config, its checkpoint, and a call of its EMA student made by the code of then."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from elfreg.checkpoint import open_checkpoint
from elfreg.config import Config, ConfigError, migrated_key
from elfreg.toy.study.plan import PlanFile, resolve

OLD_RUN = Path(__file__).resolve().parent / "fixtures" / "run_before_model_settings"


def test_an_old_run_folders_config_reads_with_the_model_settings_and_saves_them_there(tmp_path):
    raw = yaml.safe_load((OLD_RUN / "config.yaml").read_text())
    assert (raw["loss"]["repa"], raw["loss"]["extra_token"]) == (True, "learned") and "repa" not in raw["model"]
    cfg = Config.load(OLD_RUN / "config.yaml")
    assert (cfg.model.repa, cfg.model.extra_token, cfg.loss.repa_weight) == (True, "learned", 0.5)
    assert cfg.needs_teacher
    cfg.save(tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (saved["model"]["repa"], saved["model"]["extra_token"]) == (True, "learned")
    assert set(saved["loss"]) == {"repa_weight", "reg_weight"}
    assert Config.load(tmp_path / "config.yaml") == cfg


def test_an_old_checkpoint_loads_and_computes_what_the_code_of_then_computed():
    ckpt = open_checkpoint(OLD_RUN)  # the run folder: its newest intact checkpoint
    assert ckpt.path.name == "step-0000002"
    student = ckpt.load_student()  # EMA weights
    assert (student.extra_token, student.use_repa) == ("learned", True)
    ref = load_file(str(OLD_RUN / "reference_call.safetensors"))
    with torch.no_grad():
        out = student(ref["z"], ref["q"], ref["t"], ref["w"], ref["prompt_mask"].bool(), want_repa=True)
    # the same function of the same weights; only float rounding may differ across CPUs
    torch.testing.assert_close(out.x_hat, ref["x_hat"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.repa, ref["repa"], rtol=1e-5, atol=1e-6)
    assert ref["x_hat"][:, 3:].abs().max() > 0.01  # a prediction, not the zero-initialised head


def test_old_keys_keep_working_in_overrides_and_plans_and_both_places_at_once_are_refused(tmp_path):
    assert migrated_key("loss.repa") == "model.repa" and migrated_key("loss.repa_weight") == "loss.repa_weight"
    new = tmp_path / "new.yaml"
    Config.load(OLD_RUN / "config.yaml").save(new)
    assert Config.load(new, ["loss.repa=false", "loss.extra_token=none"]).model.repa is False
    assert Config.load(new, ["loss.extra_token=none"]).model.extra_token == "none"
    with pytest.raises(ConfigError, match=r"^config error: loss.repa: this key moved to model.repa"):
        Config.from_dict({"loss": {"repa": False}, "model": {"repa": True}})
    base = Config.load(OLD_RUN / "config.yaml").to_dict()
    base["data"] = {"source": "toy-arith"}
    axes = dict(models=["plain"], train_seeds=[0], samplers=["early-stop"], nfes=[4], sample_seeds=[0])
    old = PlanFile(base=base, model_defs={"plain": {"loss": {"repa": False, "extra_token": "none"}}}, **axes)
    now = PlanFile(base=base, model_defs={"plain": {"model.repa": False, "model.extra_token": "none"}}, **axes)
    old_study, new_study = resolve(old, tmp_path), resolve(now, tmp_path)
    assert old_study.models["plain"] == new_study.models["plain"] and not old_study.models["plain"].needs_teacher
    assert old_study.identity() == new_study.identity()
