"""Building a run from its config, calibrating REG, and resuming one exactly."""

import pytest
import torch
from train_helpers import EXAMPLES

from elfreg.train.build import build_run, calibrate_reg, resume, start_run
from elfreg.train.loop import save
from elfreg.train.step import train_step


def test_a_built_run_depends_on_its_config_alone(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train={"out_dir": str(tmp_path / "never")})
    a, b = build_run(cfg, EXAMPLES), build_run(cfg, EXAMPLES)
    assert all(torch.equal(v, b.student.state_dict()[k]) for k, v in a.student.state_dict().items())
    assert a.cache is None and a.dist.world == 1 and a.model.student is a.student
    assert a.with_teacher and a.run_dir == tmp_path / "never"
    assert not (tmp_path / "never").exists()  # building reads and writes nothing in the run folder
    other = build_run(tiny_cfg(train={"seed": 1}), EXAMPLES)
    assert not torch.equal(other.student.self_cond_proj.weight, a.student.self_cond_proj.weight)
    assert build_run(tiny_cfg(train={"feature_cache": True}), EXAMPLES).cache is not None
    with pytest.raises(ValueError, match="no training examples"):
        build_run(cfg, [])


def test_reg_calibration_is_a_fixed_draw(tiny_cfg):
    a, b = build_run(tiny_cfg(), EXAMPLES), build_run(tiny_cfg(), EXAMPLES)
    assert torch.equal(a.frozen.teacher.reg_std, torch.ones_like(a.frozen.teacher.reg_std))
    calibrate_reg(a)
    calibrate_reg(b)
    assert torch.equal(a.frozen.teacher.reg_mean, b.frozen.teacher.reg_mean)
    assert torch.equal(a.frozen.teacher.reg_std, b.frozen.teacher.reg_std)
    assert not torch.equal(a.frozen.teacher.reg_std, torch.ones_like(a.frozen.teacher.reg_std))


def test_resume_restores_the_exact_state(tiny_cfg):
    cfg = tiny_cfg(train={"steps": 6, "batch_size": 3})
    first = build_run(cfg, EXAMPLES)
    calibrate_reg(first)
    for s in range(3):
        train_step(first, s)
    path = save(first, 3)
    assert first.last_checkpoint == path
    again = build_run(cfg, EXAMPLES)
    assert resume(again, cfg.train.out_dir) == 3 and again.last_checkpoint == path
    for name in ("student", "ema"):
        have, want = getattr(again, name).state_dict(), getattr(first, name).state_dict()
        assert have.keys() == want.keys() and all(torch.equal(have[k], want[k]) for k in want)
    have, want = again.optimizer.state_dict(), first.optimizer.state_dict()
    assert have["param_groups"] == want["param_groups"]
    for k, slots in want["state"].items():
        assert all(torch.equal(have["state"][k][n], v) for n, v in slots.items())
    assert torch.equal(again.frozen.teacher.reg_mean, first.frozen.teacher.reg_mean)
    assert torch.equal(again.frozen.teacher.reg_std, first.frozen.teacher.reg_std)
    # ... so the next step is the same step
    a, b = train_step(first, 3), train_step(again, 3)
    assert (a.losses, a.lr, a.grad_norm) == (b.losses, b.lr, b.grad_norm)


def test_start_run_opens_a_fresh_folder_or_continues_one(tiny_cfg):
    cfg = tiny_cfg(train={"steps": 4})
    run, step = start_run(cfg, EXAMPLES)
    assert step == 0 and run.last_checkpoint is None
    assert (run.run_dir / "config.yaml").exists()
    assert not torch.equal(run.frozen.teacher.reg_std, torch.ones_like(run.frozen.teacher.reg_std))
    train_step(run, 0)
    save(run, 1)
    again, step = start_run(cfg, EXAMPLES)
    assert step == 1 and again.last_checkpoint == run.last_checkpoint
    with pytest.raises(FileExistsError):
        start_run(cfg, EXAMPLES, resume_existing=False)
