"""The sharded checkpoint form on one process (a process group of one): the same intact-or-not
scan and fallback as the one-process form, and its content read back whole."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from train_helpers import EXAMPLES

from elfreg.checkpoint import (
    CheckpointWarning,
    checkpoint_problem,
    open_checkpoint,
    read_sharded,
    resolve_checkpoint,
)
from elfreg.distributed import shutdown_distributed
from elfreg.train.build import build_run, resume
from elfreg.train.loop import train


@pytest.fixture
def sharded_run(tiny_cfg):
    cfg = tiny_cfg(train={"steps": 4, "ckpt_every": 2, "parallel": "ddp", "device": "cpu", "precision": "fp32"})
    try:
        train(cfg, EXAMPLES)
    finally:
        shutdown_distributed()
    return cfg


def _damage(ckpt: Path, how: str) -> None:
    shard = next((ckpt / "state").glob("*.distcp"))
    if how == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:100])
    elif how == "missing shard":
        shard.unlink()
    elif how == "garbled metadata":
        (ckpt / "state" / ".metadata").write_bytes(b"not a pickle")
    else:
        (ckpt / "meta.json").unlink()


@pytest.mark.parametrize("how", ["truncated shard", "missing shard", "garbled metadata", "missing meta"])
def test_a_damaged_sharded_checkpoint_is_skipped_for_the_previous_one(sharded_run, how):
    root = Path(sharded_run.train.out_dir)
    newest = resolve_checkpoint(root)
    assert newest.name == "step-0000004" and checkpoint_problem(newest) is None
    _damage(newest, how)
    assert checkpoint_problem(newest) is not None
    with pytest.warns(CheckpointWarning, match="step-0000004"):
        assert resolve_checkpoint(root).name == "step-0000002"


def test_a_sharded_checkpoint_reads_back_the_run_state(sharded_run):
    ckpt = open_checkpoint(sharded_run.train.out_dir)
    assert ckpt.sharded and ckpt.meta["parallel"] == "ddp" and ckpt.meta["world_size"] == 1
    run = build_run(sharded_run.__class__.from_dict({**sharded_run.to_dict(),
                                                     "train": {**sharded_run.to_dict()["train"], "parallel": "none"}}),
                    EXAMPLES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DCP chatter about a single process
        assert resume(run, sharded_run.train.out_dir) == 4
    model = ckpt.model_state()
    assert all(torch.equal(run.student.state_dict()[k], v) for k, v in model.items())
    assert all(torch.equal(run.ema.state_dict()[k], v) for k, v in ckpt.ema_state().items())
    state = ckpt.train_state()
    assert torch.equal(run.frozen.teacher.reg_std, state["reg_std"]) and not torch.all(state["reg_std"] == 1)
    saved = read_sharded(ckpt.path / "state", "optim")
    names = {id(p): n for n, p in run.student.named_parameters()}
    assert len(run.optimizer.state) == len([k for k in saved if k.endswith(".step")])
    for param, slots in run.optimizer.state.items():
        for slot, value in slots.items():
            assert torch.equal(value, saved[f"state.{names[id(param)]}.{slot}"]), (names[id(param)], slot)


@pytest.mark.parametrize(("first", "second"), [("ddp", "none"), ("none", "ddp")])
def test_parameters_without_optimizer_state_resume_as_in_an_uninterrupted_run(tiny_cfg, tmp_path, first, second):
    """With decode_prob 0.1 no decode row occurs before step 4, so a checkpoint at step 2 holds no
    optimiser state for the decoder head. Resumed from the sharded form, the head must start its
    Adam moments at step 4 as the uninterrupted run does (not fail, nor count from a fresh slot)."""
    from train_helpers import metrics

    def cfg(name: str, parallel: str):
        return tiny_cfg(flow={"decode_prob": 0.1}, train={"steps": 6, "ckpt_every": 2, "parallel": parallel,
                                                          "out_dir": str(tmp_path / name), "device": "cpu"})

    train(cfg("straight", "none"), EXAMPLES)
    try:  # either form of checkpoint, resumed into the other kind of run
        train(cfg("sliced", first), EXAMPLES, stop_at=2)
        train(cfg("sliced", second), EXAMPLES)
    finally:
        shutdown_distributed()
    straight, sliced = metrics(tmp_path / "straight"), metrics(tmp_path / "sliced")
    assert [m["decode"] > 0 for m in straight[:4]] == [False, False, False, True]
    for a, b in zip(straight, sliced, strict=True):
        assert b["total"] == pytest.approx(a["total"], rel=1e-6), a["step"]
