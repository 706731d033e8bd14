"""The defaults are ELF's training recipe, and every shipped config resolves as it did before they
became so: the toy recipes and presets set their own optimisation settings.

``tests/fixtures/resolved_configs.json`` holds what each of ``configs/*.yaml`` (each model of a
study plan), and the toy demo's DEMO and QUICK presets resolved to before the change: the
defaults of then and each config's differences from them. A config changed on purpose since
needs its entry rewritten from a fresh resolution (``resolved_configs`` below).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from elfreg.config import Config, migrated_key
from elfreg.toy.demo import demo_config
from elfreg.toy.study.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = Path(__file__).resolve().parent / "fixtures" / "resolved_configs.json"
ELF_OWT_B = {"global_batch_size": 512, "blr": 0.001, "warmup_steps": 5000, "lr_schedule": "constant",
             "weight_decay": 0.0, "optimizer": "muon", "ema_decay1": 0.9999, "adam_b1": 0.9, "adam_b2": 0.95}
"""ELF's recipe: its train_*_ELF-B.yml with its Config defaults (lr_schedule, adam betas)."""


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolved_configs() -> dict[str, dict]:
    """Every shipped config resolved, flat: run configs by file name, study plans by
    ``file:model``, the demo's presets as ``toy.demo:DEMO`` and ``toy.demo:QUICK``."""
    out = {}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if "models" in (yaml.safe_load(path.read_text()) or {}):  # a study plan
            out.update({f"{path.name}:{name}": _flat(cfg.to_dict()) for name, cfg in load_plan(path).models.items()})
        else:
            out[path.name] = _flat(Config.load(path).to_dict())
    out["toy.demo:DEMO"] = _flat(demo_config().to_dict())
    out["toy.demo:QUICK"] = _flat(demo_config(quick=True).to_dict())
    return out


def test_the_training_defaults_are_elfs_recipe():
    train = Config().train
    assert (train.optimizer, train.batch_size, train.warmup_steps, train.schedule) == (
        ELF_OWT_B["optimizer"], ELF_OWT_B["global_batch_size"], ELF_OWT_B["warmup_steps"], ELF_OWT_B["lr_schedule"])
    assert train.lr == pytest.approx(ELF_OWT_B["blr"] * ELF_OWT_B["global_batch_size"] / 256)
    assert (train.ema_decay, train.weight_decay, train.beta1, train.beta2, train.grad_clip, train.muon_momentum) == (
        ELF_OWT_B["ema_decay1"], ELF_OWT_B["weight_decay"], ELF_OWT_B["adam_b1"], ELF_OWT_B["adam_b2"], 1.0, 0.95)
    paper = Config.load(ROOT / "configs" / "elf-reg-b-gsm8k.yaml").train
    assert all(getattr(paper, k) == getattr(train, k) for k in ("optimizer", "batch_size", "lr", "warmup_steps",
                                                                 "schedule", "weight_decay", "ema_decay"))


def test_every_shipped_config_resolves_as_before_the_training_defaults_changed():
    snapshot = json.loads(SNAPSHOT.read_text())
    now = resolved_configs()
    assert {"tiny.yaml", "toy.demo:DEMO", "toy.demo:QUICK", "toy-study-level1.yaml"} <= set(now) & set(
        snapshot["configs"])
    changed = []
    for name, differences in snapshot["configs"].items():
        if name not in now:
            continue  # a config removed since: nothing left to resolve
        before = {**snapshot["defaults"], **differences}
        # a key that has moved since is read at its current place (elfreg.config.migration)
        changed += [f"{name}: {key} was {value!r}, is {now[name].get(migrated_key(key))!r}"
                    for key, value in before.items() if now[name].get(migrated_key(key)) != value]
    assert changed == []
    # the defaults did change: the configs hold their old values by setting them
    moved = {k for k, v in snapshot["defaults"].items() if _flat(Config().to_dict()).get(migrated_key(k)) != v}
    assert {"train.optimizer", "train.batch_size", "train.lr", "train.warmup_steps", "train.schedule",
            "train.ema_decay"} <= moved
