import pytest
import yaml

from elfreg.config import Config, ConfigError, EvalConfig


def _write(tmp_path, data):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults_are_the_paper_settings():
    cfg = Config()
    assert (cfg.flow.sigma, cfg.flow.c_min, cfg.flow.decode_prob, cfg.flow.sc_prob) == (2.0, 0.05, 0.2, 0.5)
    assert (cfg.loss.repa_weight, cfg.loss.reg_weight) == (0.5, 0.1)
    assert (cfg.text.encoder_layer, cfg.text.repa_layer, cfg.text.reg_layer) == (20, 20, 24)
    assert (cfg.text.canvas_len, cfg.sample.rho) == (1024, 8)


def test_unknown_key_fails_with_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        Config.load(_write(tmp_path, {"train": {"stepz": 3}}))
    msg = str(err.value)
    assert "train.stepz" in msg and "unknown key" in msg and "\n" not in msg


def test_wrong_type_fails_with_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        Config.load(_write(tmp_path, {"train": {"lr": "fast"}}))
    assert "train.lr" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="model.extra_token"):
        Config.from_dict({"model": {"extra_token": "global"}})
    with pytest.raises(ConfigError, match="train.steps"):
        Config.from_dict({"train": {"steps": True}})


def test_range_checks_name_the_key():
    with pytest.raises(ConfigError, match="text.prompt_cap"):
        Config.from_dict({"text": {"canvas_len": 16, "prompt_cap": 16}})
    with pytest.raises(ConfigError, match="text.teacher"):
        Config.from_dict({"text": {"teacher": None}})
    Config.from_dict({"text": {"teacher": None}, "model": {"repa": False, "extra_token": "none"}})


def test_yaml_round_trip_and_overrides(tmp_path):
    cfg = Config.from_dict({"train": {"steps": 7}, "model": {"width": 64, "heads": 4}})
    cfg.save(tmp_path / "r.yaml")
    again = Config.load(tmp_path / "r.yaml", ["train.lr=0.01", "model.repa=false", "model.extra_token=learned"])
    assert again.train.steps == 7 and again.model.width == 64
    assert again.train.lr == 0.01 and again.model.repa is False and again.model.extra_token == "learned"
    assert Config.load(tmp_path / "r.yaml").to_dict() == cfg.to_dict()
    with pytest.raises(ConfigError, match="train.nope"):
        Config.load(tmp_path / "r.yaml", ["train.nope=1"])


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    # YAML 1.1 reads "2e-3" as a string; a float field must still take it, and reject non-numbers
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 2e-3\n")
    assert Config.load(path, ["flow.sigma=1E+0"]).train.lr == pytest.approx(2e-3)
    assert Config.load(path, ["flow.sigma=1E+0"]).flow.sigma == 1.0
    with pytest.raises(ConfigError, match="train.lr"):
        Config.load(path, ["train.lr=2e-3x"])
    with pytest.raises(ConfigError, match="train.steps"):
        Config.load(path, ["train.steps=1e3"])


@pytest.mark.parametrize(("override", "key"), [
    ("train.ckpt_every=0", "train.ckpt_every"), ("train.log_every=0", "train.log_every"),
    ("train.warmup_steps=-10", "train.warmup_steps"), ("train.min_lr_ratio=1.5", "train.min_lr_ratio"),
    ("train.decay_steps=0", "train.decay_steps"),
    ("train.grad_clip=0", "train.grad_clip"), ("train.out_dir=' '", "train.out_dir"),
    ("data.limit=-1", "data.limit"), ("data.source=jsonl", "data.path"), ("loss.repa_weight=-1", "loss.repa_weight"),
    ("sample.nfe=1", "sample.nfe"), ("sample.sampler=ddim", "sample.sampler"), ("eval.samples=0", "eval.samples"),
    ("eval.nfes=[16,1]", "eval.nfes"), ("train.lr=null", "train.lr"),
])
def test_every_out_of_range_value_fails_before_anything_runs(tmp_path, override, key):
    with pytest.raises(ConfigError) as err:
        Config.load(_write(tmp_path, {}), [override])
    assert str(err.value).startswith(f"config error: {key}:") and "\n" not in str(err.value)


def test_sample_and_eval_settings_replace_and_sweep():
    cfg = Config.from_dict({"sample": {"nfe": 16}, "eval": {"nfes": [4, 8], "samplers": ["full-span", "renoise"]}})
    grid = cfg.eval.grid(cfg.sample)
    assert [(s.sampler, s.nfe) for s in grid] == [("full-span", 4), ("full-span", 8), ("renoise", 4), ("renoise", 8)]
    assert all(s.rho == cfg.sample.rho for s in grid)
    assert [s.nfe for s in Config().eval.grid(cfg.sample)] == [16]  # empty sweep: the sample section's value
    # the same sweep as changes to a checkpoint's settings: an axis it leaves empty is left out
    assert EvalConfig(nfes=[4, 8]).points() == [{"nfe": 4}, {"nfe": 8}]
    assert EvalConfig(nfes=[4]).points(sampler="renoise") == [{"sampler": "renoise", "nfe": 4}]
    assert EvalConfig().points() == [{}] and EvalConfig().points(nfe=16) == [{"nfe": 16}]
    assert cfg.sample.replace(nfe=None, rho=4) == cfg.sample.replace(rho=4)  # None means "not given"
    with pytest.raises(ConfigError, match="sample: unknown"):
        cfg.sample.replace(steps=3)


def test_toy_balance_only_for_one_step_arith(tmp_path):
    assert Config.load(_write(tmp_path, {}), ["data.toy_balance=tens"]).data.toy_balance == "tens"
    for other in (["data.toy_level=2"], ["data.source=toy-code"]):
        with pytest.raises(ConfigError) as err:
            Config.load(_write(tmp_path, {}), ["data.toy_balance=tens", *other])
        assert str(err.value).startswith("config error: data.toy_balance:")
        assert str(err.value).endswith("elsewhere set it to combination")  # the message names the fix


def test_toy_level1_share_only_mixes_into_arith_chains(tmp_path):
    cfg = Config.load(_write(tmp_path, {}), ["data.toy_level=2", "data.toy_level1_share=0.25", "data.toy_balance=tens"])
    assert (cfg.data.toy_level1_share, cfg.data.toy_balance) == (0.25, "tens")
    for bad in (["data.toy_level1_share=0.25"], ["data.toy_level=2", "data.toy_level1_share=1.0"],
                ["data.toy_level=2", "data.toy_level1_share=-0.1"]):
        with pytest.raises(ConfigError) as err:
            Config.load(_write(tmp_path, {}), bad)
        assert str(err.value).startswith("config error: data.toy_level1_share:")


def test_no_self_conditioning_needs_no_sc_cfg_tokens_and_builds_a_student_called_without_it():
    from elfreg.model.presets import student_from_config

    with pytest.raises(ConfigError, match=r"^config error: flow.sc_prob: 0 \(no self-conditioning\) needs "
                                          r"model.cfg_tokens: 0"):
        Config.from_dict({"flow": {"sc_prob": 0.0}})
    small = {"width": 32, "depth": 2, "heads": 2, "repa_block": 1, "projector_hidden": 16, "time_freq_dim": 8}
    without = Config.from_dict({"flow": {"sc_prob": 0.0}, "model": {**small, "cfg_tokens": 0}})
    assert not student_from_config(without, 8, 20, 12).self_conditioning
    assert student_from_config(Config.from_dict({"model": small}), 8, 20, 12).self_conditioning
