"""Toy assets: quick build, cache reuse, atomic builds, hub-style loading, trained LMs, greedy scoring."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from elfreg.progress import BARS_OFF_ENV
from elfreg.toy import assets as toy_assets
from elfreg.toy import corpus as TC
from elfreg.toy import lm as toy_lm
from elfreg.toy.arith import make_level1
from elfreg.toy.code import make_problem

TINY_ENCODER = toy_lm.ToyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                  intermediate_size=128, steps=40, batch_size=16, lr=5e-3, warmup_steps=5)
TINY_TEACHER = toy_lm.ToyLMConfig(hidden_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                                  intermediate_size=192, steps=30, batch_size=16, lr=5e-3, warmup_steps=5)
# One after the other in this process, where the tests below can replace ``pretrain_lm``.
BUILD = dict(quick=True, encoder=TINY_ENCODER, teacher=TINY_TEACHER, corpus_size=600, progress=False,
             side_by_side=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return cache, toy_assets.build_toy_assets(cache, **BUILD)


def test_build_layout_and_reuse(built, monkeypatch) -> None:
    cache, assets = built
    assert not assets.reused
    assert [p.name for p in cache.iterdir()] == ["toy_assets"]
    assert [p.name for p in (cache / "toy_assets").iterdir()] == [assets.root.name]
    assert assets.root.name.startswith("quick-")
    for folder in (assets.encoder_dir, assets.teacher_dir):
        assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    settings = json.loads((assets.root / "settings.json").read_text())
    assert settings["encoder"]["hidden_size"] == 64 and settings["teacher"]["hidden_size"] == 96
    report = assets.report
    assert report["encoder"]["steps"] == 40 and report["teacher"]["steps"] == 30
    for name in ("encoder", "teacher"):  # the digit readout of every block's output (JSON keys)
        readout = report[name]["digit_readout"]
        assert set(readout) == {"1", "2"} and all(0.0 <= v <= 1.0 for v in readout.values())

    def no_training(*args, **kwargs):
        raise AssertionError("a cached build must not retrain")

    mtime = (assets.encoder_dir / "config.json").stat().st_mtime_ns
    monkeypatch.setattr(toy_assets, "pretrain_lm", no_training)
    again = toy_assets.build_toy_assets(cache, **BUILD)
    assert again.reused and again.root == assets.root
    assert (assets.encoder_dir / "config.json").stat().st_mtime_ns == mtime
    # Different settings are a different cache entry (and would train).
    with pytest.raises(AssertionError, match="must not retrain"):
        toy_assets.build_toy_assets(cache, **{**BUILD, "corpus_size": 601})
    assert [p.name for p in (cache / "toy_assets").iterdir()] == [assets.root.name]


def _same_up_to_rounding(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Two trainings' weights equal up to what another summation order makes of them. At another
    thread count, or in another process, a CPU's kernels may sum in another order (this AVX2
    machine's do not: the weights come out bit for bit). Measured here on the encoder's training:
    every weight perturbed by 1e-7 of itself after the first step moved no weight by more than
    4e-6 of its tensor's largest value after 40 fp32 steps; perturbed by 1e-3 in bf16, where one
    rounding flip alone is 0.4 % of a value, by 5 %."""
    tol = 1e-4 if toy_assets.resolved_precision(TINY_ENCODER).precision == "fp32" else 0.1
    return a.keys() == b.keys() and all(
        float((a[k] - b[k]).abs().max()) <= tol * max(float(a[k].abs().max()), 1e-12) for k in a)


def _same_curves(a: list[float], b: list[float]) -> bool:
    # the loss curves (4 decimals) of those perturbed runs moved by at most 1e-3
    return a == pytest.approx(b, abs=5e-3)


def test_side_by_side_build_is_the_same_build(built, tmp_path, monkeypatch, capfd) -> None:
    """The two LMs pretrained at once in two child processes on one thread each come out as one
    after the other here on torch's thread count (up to rounding, see above), so the choice can
    stay out of the cache key; without progress the children draw no bar, not even the libraries'."""
    _, here = built

    def not_here(*args, **kwargs):
        raise AssertionError("a side-by-side build must pretrain in its child processes")

    monkeypatch.setattr(toy_assets, "pretrain_lm", not_here)  # a spawned child imports its own
    for name in BARS_OFF_ENV:  # as a process nobody silenced would start them
        monkeypatch.delenv(name, raising=False)
    capfd.readouterr()
    apart = toy_assets.build_toy_assets(tmp_path, **{**BUILD, "side_by_side": True})
    assert "Writing model shards" not in capfd.readouterr().err
    assert apart.root.name == here.root.name
    assert apart.report["lms_side_by_side"] and not here.report["lms_side_by_side"]
    for name in ("encoder", "teacher"):
        assert _same_up_to_rounding(load_file(apart.root / name / "model.safetensors"),
                                    load_file(here.root / name / "model.safetensors"))
        assert _same_curves(apart.report[name]["loss_curve"], here.report[name]["loss_curve"])
        readouts = apart.report[name]["digit_readout"], here.report[name]["digit_readout"]
        assert readouts[0].keys() == readouts[1].keys()
        assert all(readouts[0][k] == pytest.approx(readouts[1][k], abs=0.05) for k in readouts[0])


def test_threads_handed_on_midway_change_no_weight(built) -> None:
    """``threads_now`` (how a side-by-side build hands a finished LM's CPU to the other) moves the
    thread count mid-run and leaves every weight as a run on one thread count makes it (up to
    rounding, see above)."""
    _, assets = built
    tok = AutoTokenizer.from_pretrained(str(assets.tokenizer_dir))
    examples = TC.train_examples(TC.ToyTaskConfig(), 64, seed=0)
    cfg = replace(TINY_ENCODER, steps=12)
    asked = []

    def one_then_two() -> int:
        asked.append(torch.get_num_threads())
        return 1 if len(asked) <= 6 else 2

    steady, _ = toy_lm.pretrain_lm(cfg, tok, examples, progress=False, num_threads=1)
    moved, _ = toy_lm.pretrain_lm(cfg, tok, examples, progress=False, num_threads=1, threads_now=one_then_two)
    assert asked[:7] == [1] * 7 and asked[7:] == [2] * 5  # it was asked every step and obeyed
    assert _same_up_to_rounding(steady.state_dict(), moved.state_dict())


def test_saved_lms_load_like_hub_models_and_learned(built) -> None:
    _, assets = built
    tok = AutoTokenizer.from_pretrained(str(assets.encoder_dir))
    texts = [TC.lm_text(e) for e in TC.train_examples(TC.ToyTaskConfig(), 64, seed=0)]
    for folder, cfg in ((assets.encoder_dir, TINY_ENCODER), (assets.teacher_dir, TINY_TEACHER)):
        model = AutoModelForCausalLM.from_pretrained(str(folder))
        assert isinstance(model, Qwen3ForCausalLM)
        assert model.config.hidden_size == cfg.hidden_size
        assert model.config.eos_token_id == tok.eos_token_id == model.config.pad_token_id
        assert model.config.vocab_size >= len(tok)
        torch.manual_seed(0)
        untrained = Qwen3ForCausalLM(model.config)
        trained_loss = toy_lm.lm_loss(model, tok, texts)
        untrained_loss = toy_lm.lm_loss(untrained, tok, texts)
        assert untrained_loss > 6.0
        assert trained_loss < untrained_loss - 2.5, (trained_loss, untrained_loss)


def test_killed_build_leaves_nothing_reusable(tmp_path, monkeypatch) -> None:
    small = {**BUILD, "corpus_size": 100,
             **{k: toy_assets.resolved_precision(replace(v, steps=2))
                for k, v in (("encoder", TINY_ENCODER), ("teacher", TINY_TEACHER))}}
    real = toy_assets.pretrain_lm
    calls = []

    def killed_during_teacher(cfg, *args, **kwargs):
        calls.append(cfg)
        if cfg == small["teacher"]:
            raise KeyboardInterrupt
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(toy_assets, "pretrain_lm", killed_during_teacher)
    with pytest.raises(KeyboardInterrupt):
        toy_assets.build_toy_assets(tmp_path, **small)
    assert calls == [small["encoder"], small["teacher"]]
    assert list((tmp_path / "toy_assets").iterdir()) == []

    # A temporary folder left by a process that died mid-build is removed, never reused.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    settings = toy_assets.asset_settings(TC.ToyTaskConfig(), True, small["encoder"], small["teacher"], 1024, 100)
    stale = tmp_path / "toy_assets" / f".tmp-quick-{toy_assets.settings_hash(settings)}-{dead.pid}-abcd"
    (stale / "encoder").mkdir(parents=True)
    monkeypatch.setattr(toy_assets, "pretrain_lm", real)
    assets = toy_assets.build_toy_assets(tmp_path, **small)
    assert not assets.reused
    assert [p.name for p in (tmp_path / "toy_assets").iterdir()] == [assets.root.name]
    assert assets.root.name == f"quick-{toy_assets.settings_hash(settings)}"


def test_greedy_accuracy_uses_the_training_format(tmp_path, built) -> None:
    """An LM that memorised one example answers it (accuracy 1) and not a different one (0)."""
    _, assets = built
    tok = AutoTokenizer.from_pretrained(str(assets.tokenizer_dir))
    rng = random.Random(0)
    ex = make_level1(14, "+", 9, rng)
    other = {**make_level1(3, "-", 2, rng), "prompt": ex["prompt"]}  # same prompt, wrong reference
    cfg = toy_lm.ToyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                             steps=60, batch_size=8, lr=1e-2, warmup_steps=5)
    model, stats = toy_lm.pretrain_lm(cfg, tok, [ex] * 16, progress=False)
    assert stats.final_loss < 0.1
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    assert toy_lm.greedy_accuracy(tmp_path / "lm", [ex]) == 1.0
    assert toy_lm.greedy_accuracy(tmp_path / "lm", [other]) == 0.0
    loaded, loaded_tok = toy_lm.load_lm(tmp_path / "lm")
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    (out,) = toy_lm.greedy_generate(loaded, loaded_tok, [TC.lm_prompt(ex)])
    assert out == ex["answer"]


def test_score_answer() -> None:
    ex = make_level1(14, "+", 9, random.Random(0))
    assert toy_lm.score_answer(ex, "14 + 9 = 23\n#### 23")
    assert not toy_lm.score_answer(ex, "14 + 9 = 23\n#### 24")
    code = make_problem("times", (4,), random.Random(0))
    assert toy_lm.score_answer(code, code["answer"])
    assert not toy_lm.score_answer(code, code["answer"].replace("* 4", "* 5"))


def test_cache_key_holds_the_resolved_precision(monkeypatch) -> None:
    # a bf16 build and an fp32 build are different models: they must not share a cache folder
    from elfreg.device import PRECISION_ENV

    keys = {}
    for forced in ("fp32", "bf16"):
        monkeypatch.setenv(PRECISION_ENV, forced)
        settings = toy_assets.asset_settings(TC.ToyTaskConfig(), True, TINY_ENCODER, TINY_TEACHER, 256, 600)
        assert settings["encoder"]["precision"] == settings["teacher"]["precision"] == forced
        keys[forced] = toy_assets.settings_hash(settings)
    assert keys["fp32"] != keys["bf16"]
    monkeypatch.delenv(PRECISION_ENV)
    auto = toy_assets.asset_settings(TC.ToyTaskConfig(), True, TINY_ENCODER, TINY_TEACHER, 256, 600)
    assert toy_assets.settings_hash(auto) == keys["fp32"]  # auto on a CPU is fp32, on every CPU


def test_untied_embeddings_stay_untied_through_training_and_loading(built, tmp_path) -> None:
    _, assets = built
    tok = AutoTokenizer.from_pretrained(str(assets.encoder_dir))
    examples = TC.train_examples(TC.ToyTaskConfig(), 40, seed=0)
    assert not toy_assets.DEFAULT_ENCODER.tie_embeddings and not toy_assets.QUICK_ENCODER.tie_embeddings
    assert toy_assets.DEFAULT_TEACHER.tie_embeddings
    for tie in (True, False):
        cfg = replace(TINY_ENCODER, steps=3, tie_embeddings=tie)
        model, _ = toy_lm.pretrain_lm(cfg, tok, examples, progress=False)
        shared = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert shared is tie
        model.save_pretrained(tmp_path / str(tie))
        loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / str(tie)))
        assert (loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()) is tie
        assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    # the setting keys the cache: a tied and an untied build are different models
    a = toy_assets.asset_settings(TC.ToyTaskConfig(), False, TINY_ENCODER, TINY_TEACHER, 300, 100)
    b = toy_assets.asset_settings(TC.ToyTaskConfig(), False, replace(TINY_ENCODER, tie_embeddings=False),
                                  TINY_TEACHER, 300, 100)
    assert toy_assets.settings_hash(a) != toy_assets.settings_hash(b)
