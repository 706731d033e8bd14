"""One optimisation step as a function: it is exactly a step of ``train()``."""

import pytest
import torch
from train_helpers import EXAMPLES, metrics, poison_loss

from elfreg.checkpoint import open_checkpoint
from elfreg.train import step as step_module
from elfreg.train.build import build_run, calibrate_reg
from elfreg.train.loop import train
from elfreg.train.optim import lr_at
from elfreg.train.step import PHASES, TrainingDiverged, train_step


def _fresh_run(cfg):
    run = build_run(cfg, EXAMPLES)
    calibrate_reg(run)
    return run


def test_two_train_steps_are_two_steps_of_train(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train={"steps": 2, "batch_size": 3, "grad_accum": 2, "out_dir": str(tmp_path / "t")})
    trained = train(cfg, EXAMPLES)
    run = _fresh_run(cfg)
    results = [train_step(run, 0), train_step(run, 1)]
    for result, logged in zip(results, metrics(trained.run_dir), strict=True):
        assert result.lr == logged["lr"] and result.grad_norm == logged["grad_norm"]
        assert result.losses == {k: logged[k] for k in result.losses}
        assert result.tokens == 2 * 3 * cfg.text.canvas_len
    saved = open_checkpoint(trained.run_dir)
    assert all(torch.equal(run.student.state_dict()[k].cpu(), v) for k, v in saved.model_state().items())
    assert all(torch.equal(run.ema.state_dict()[k], v) for k, v in saved.ema_state().items())
    assert set(saved.train_state()) == {"optimizer", "reg_mean", "reg_std"}  # no RNG state: draws are of the step


def test_a_step_averages_its_micro_batches_in_order(tiny_cfg, monkeypatch):
    run = _fresh_run(tiny_cfg(train={"batch_size": 2, "grad_accum": 3, "steps": 10}))
    seen, per_micro = [], []
    real_batch, real_loss = step_module.micro_batch, step_module.elf_reg_loss

    def recording_batch(r, k):
        seen.append(k)
        return real_batch(r, k)

    def recording_loss(*args, **kwargs):
        out = real_loss(*args, **kwargs)
        per_micro.append(out.as_floats())
        return out

    monkeypatch.setattr(step_module, "micro_batch", recording_batch)
    monkeypatch.setattr(step_module, "elf_reg_loss", recording_loss)
    first, second = train_step(run, 0), train_step(run, 1)
    assert seen == [0, 1, 2, 3, 4, 5]  # micro-batches step·A … step·A + A − 1
    for result, micros in ((first, per_micro[:3]), (second, per_micro[3:])):
        for key, value in result.losses.items():
            assert value == pytest.approx(sum(m[key] for m in micros) / 3, rel=1e-12)
    assert [g["lr"] for g in run.optimizer.param_groups] == [lr_at(1, run.cfg.train)] * 2


def test_a_profiled_step_labels_each_part_once_per_micro_batch_or_step(tiny_cfg):
    """benchmarks/student_width_ab.py --phase-steps times a step by these labels."""
    run = _fresh_run(tiny_cfg(train={"batch_size": 2, "grad_accum": 3, "steps": 10}))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train_step(run, 0)
        train_step(run, 1)
    counts = {e.key: e.count for e in prof.key_averages() if e.key in PHASES}
    forward, backward, optimizer, ema = PHASES
    assert counts == {forward: 6, backward: 6, optimizer: 2, ema: 2}


def test_non_finite_loss_raises_and_leaves_the_weights_alone(tiny_cfg, monkeypatch):
    run = _fresh_run(tiny_cfg(train={"grad_accum": 2}))
    train_step(run, 0)
    weights = {k: v.clone() for k, v in run.student.state_dict().items()}
    ema = {k: v.clone() for k, v in run.ema.state_dict().items()}
    poison_loss(monkeypatch, call=2, factor=float("inf"))  # the second micro-batch of step 2
    with pytest.raises(TrainingDiverged, match="non-finite loss at step 2.*none yet"):
        train_step(run, 1)
    assert all(torch.equal(v, weights[k]) for k, v in run.student.state_dict().items())
    assert all(torch.equal(v, ema[k]) for k, v in run.ema.state_dict().items())


def test_frozen_models_get_no_gradient_and_stay_unchanged(tiny_cfg):
    run = _fresh_run(tiny_cfg())
    frozen = (run.frozen.encoder.reader.base, run.frozen.teacher.reader.base)
    before = {n: p.clone() for m in frozen for n, p in m.named_parameters(prefix=str(id(m)))}
    student_before = {k: v.clone() for k, v in run.student.state_dict().items()}
    train_step(run, 0)
    for m in frozen:
        for n, p in m.named_parameters(prefix=str(id(m))):
            assert p.grad is None and not p.requires_grad
            assert torch.equal(p, before[n])
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in run.student.parameters())
    assert any(not torch.equal(v, student_before[k]) for k, v in run.student.state_dict().items())
