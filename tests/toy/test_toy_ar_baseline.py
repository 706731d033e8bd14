"""`elfreg ar-baseline`: a causal LM of the student's size and budget, trained and scored greedily."""

import json

import pytest
import torch
from safetensors.torch import load_file

from elfreg.cli import main
from elfreg.toy import ar_baseline
from elfreg.toy import lm as toy_lm
from elfreg.toy.ar_baseline import lm_params, matched_lm_config, run_ar_baseline, student_inference_params
from elfreg.toy.demo import demo_config


def _quick(*overrides: str):
    return demo_config(quick=True, overrides=["train.steps=6", "train.batch_size=4", "eval.limit=6", *overrides])


def test_the_matched_lm_has_the_students_size_and_shape():
    from elfreg.plugins import resolve_model_id
    from elfreg.text.tokenizer import load_tokenizer

    cfg = _quick()
    tokenizer = load_tokenizer(resolve_model_id(cfg.text.encoder))
    target = student_inference_params(cfg)
    lm = matched_lm_config(cfg, target, tokenizer, seed=3)
    step = lm_params(lm.__class__(**{**lm.to_dict(), "intermediate_size": lm.intermediate_size + 8}), tokenizer) \
        - lm_params(lm, tokenizer)
    # nearest multiple of 8: within half a step of MLP width (8 units) of the student's count
    assert abs(lm_params(lm, tokenizer) - target) <= step / 2 + 1
    assert (lm.hidden_size, lm.num_layers, lm.num_heads) == (cfg.model.width, cfg.model.depth, cfg.model.heads)
    assert (lm.steps, lm.batch_size, lm.seed) == (cfg.train.steps, cfg.train.batch_size, 3)
    with pytest.raises(ValueError, match="too small to match"):
        matched_lm_config(cfg, 1000, tokenizer, seed=0)


def test_runs_are_scored_reused_and_summarised(tmp_path, monkeypatch):
    cfg = _quick()
    summary = run_ar_baseline(cfg, tmp_path / "ar", [0, 1], progress=False)
    runs = summary["runs"]
    assert [r["seed"] for r in runs] == [0, 1] and all(r["n_problems"] == 6 for r in runs)
    assert all(r["examples_seen"] == 6 * 4 and r["pretrain"]["steps"] == 6 for r in runs)
    assert runs[0]["params"] == runs[1]["params"] and runs[0]["lm"]["seed"] == 0 and runs[1]["lm"]["seed"] == 1
    assert summary["pass@1_mean"] == pytest.approx((runs[0]["pass@1"] + runs[1]["pass@1"]) / 2)
    on_disk = json.loads((tmp_path / "ar" / "results.json").read_text())
    assert on_disk["runs"] == runs and on_disk["config"]["train"]["steps"] == 6
    assert (tmp_path / "ar" / "t1" / "model.safetensors").exists() and not list((tmp_path / "ar").glob(".tmp-*"))

    def fail(*args, **kwargs):
        raise AssertionError("a finished seed was trained again")

    monkeypatch.setattr(ar_baseline, "pretrain_lm", fail)
    assert run_ar_baseline(cfg, tmp_path / "ar", [1, 0], progress=False)["runs"] == runs[::-1]


def test_the_command_prints_each_seed(tmp_path, capsys):
    config = tmp_path / "quick.yaml"
    config.write_text(json.dumps(_quick().to_dict()))
    assert main(["ar-baseline", "--config", str(config), "--seeds", "2", "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("t2: pass@1 ") and "results.json" in out


class Killed(Exception):
    """A kill in the middle of a step."""


def test_a_killed_seed_goes_on_from_its_last_state_as_if_never_stopped(tmp_path, monkeypatch):
    cfg = _quick("train.steps=8")
    monkeypatch.setattr(ar_baseline, "RESUME_EVERY", 3)
    straight = run_ar_baseline(cfg, tmp_path / "straight", [0], progress=False)["runs"][0]
    assert not list((tmp_path / "straight").glob(".resume-*"))  # removed once the seed is kept

    real, calls, kill_at = toy_lm._causal_loss, [], [5]

    def killed_at_step_5(*args, **kwargs):
        calls.append(1)
        if len(calls) == kill_at[0]:
            kill_at[0] = None
            raise Killed  # steps 0-3 done, the state of step 3 written
        return real(*args, **kwargs)

    monkeypatch.setattr(toy_lm, "_causal_loss", killed_at_step_5)
    with pytest.raises(Killed):
        run_ar_baseline(cfg, tmp_path / "resumed", [0], progress=False)
    state = torch.load(tmp_path / "resumed" / ".resume-t0.pt", weights_only=False)
    assert state["step"] == 3 and len(state["losses"]) == 3
    calls.clear()
    resumed = run_ar_baseline(cfg, tmp_path / "resumed", [0], progress=False)["runs"][0]
    assert len(calls) == 5  # steps 3-7 only
    keep = ("pass@1", "params", "examples_seen")
    assert {k: resumed[k] for k in keep} == {k: straight[k] for k in keep}
    assert (resumed["pretrain"]["loss_curve"], resumed["pretrain"]["final_loss"], resumed["pretrain"]["tokens"]) == (
        straight["pretrain"]["loss_curve"], straight["pretrain"]["final_loss"], straight["pretrain"]["tokens"])
    weights = [load_file(tmp_path / d / "t0" / "model.safetensors") for d in ("straight", "resumed")]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not (tmp_path / "resumed" / ".resume-t0.pt").exists()

    # a state another pretraining wrote is refused, not continued
    calls.clear()
    kill_at[0] = 5
    with pytest.raises(Killed):
        run_ar_baseline(cfg, tmp_path / "other", [0], progress=False)
    monkeypatch.setattr(toy_lm, "_causal_loss", real)
    with pytest.raises(ValueError, match="holds a pretraining of other settings or examples"):
        run_ar_baseline(_quick("train.steps=9"), tmp_path / "other", [0], progress=False)
