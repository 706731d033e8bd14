"""`train()` end to end: learning, exact resume, refusals, divergence, crash-safe saves, ablations,
the feature cache, and the losses of a first step recomputed from the equations."""

import math

import pytest
import torch
import yaml
from train_helpers import EXAMPLES, metrics, poison_loss

from elfreg.checkpoint import open_checkpoint, resolve_checkpoint
from elfreg.config import FlowConfig
from elfreg.flow import objective
from elfreg.model.presets import student_from_config
from elfreg.text.load import load_frozen_text
from elfreg.train import step as step_module
from elfreg.train.batch import make_batch
from elfreg.train.loop import TrainingDiverged, train


def _fixed_losses(student, batch, flow: FlowConfig, loss_cfg):
    """Denoise loss (no decode rows, no self-conditioning) and decode CE, at fixed randomness."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(123)
        den = objective.elf_reg_loss(student, batch, FlowConfig(decode_prob=0.0, sc_prob=0.0), loss_cfg, g)
        g = torch.Generator().manual_seed(123)
        dec = objective.elf_reg_loss(student, batch, FlowConfig(decode_prob=1.0), loss_cfg, g)
    return den.denoise.item(), dec.decode.item()


# Each precision path is pinned and checked. At 300 steps decode CE sat at 0.10× its start, on the
# knife edge of the threshold, and the CPU's instruction set decided the verdict; at 500 steps it
# falls to 0.013× (fp32) and 0.019× (bf16), denoise loss to 0.05× and 0.06×.
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_overfits_a_handful_of_examples(tiny_cfg, precision):
    cfg = tiny_cfg(train={"steps": 500, "lr": 3e-3, "ckpt_every": 1000, "log_every": 50, "ema_decay": 0.0,
                          "batch_size": 4, "precision": precision})
    frozen = load_frozen_text(cfg.text, with_teacher=True)
    frozen.teacher.calibrate([frozen.canvas.build([e.prompt for e in EXAMPLES], [e.answer for e in EXAMPLES])])
    batch = make_batch(frozen, EXAMPLES, [0, 1, 2, 3], True, torch.device("cpu"))
    torch.manual_seed(cfg.train.seed)
    start = student_from_config(cfg, frozen.encoder.width, frozen.encoder.vocab_size, frozen.teacher.width)
    den0, dec0 = _fixed_losses(start, batch, cfg.flow, cfg.loss)

    result = train(cfg, EXAMPLES)
    trained = open_checkpoint(result.run_dir).load_student(use_ema=False)
    frozen.teacher.reg_mean = open_checkpoint(result.run_dir).train_state()["reg_mean"]
    frozen.teacher.reg_std = open_checkpoint(result.run_dir).train_state()["reg_std"]
    batch = make_batch(frozen, EXAMPLES, [0, 1, 2, 3], True, torch.device("cpu"))
    den1, dec1 = _fixed_losses(trained, batch, cfg.flow, cfg.loss)
    assert dec1 < 0.1 * dec0, (dec0, dec1)
    assert den1 < 0.5 * den0, (den0, den1)
    assert result.step == 500 and len(metrics(result.run_dir)) == 10


def test_resume_gives_identical_losses(tiny_cfg, tmp_path):
    base = dict(steps=6, ckpt_every=3, log_every=1, batch_size=3)
    straight = tiny_cfg(train={**base, "out_dir": str(tmp_path / "a")})
    train(straight, EXAMPLES)
    sliced = tiny_cfg(train={**base, "out_dir": str(tmp_path / "b")})
    first = train(sliced, EXAMPLES, stop_at=3)
    assert first.step == 3
    second = train(sliced, EXAMPLES)
    assert second.step == 6
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    for ma, mb in zip(a, b, strict=True):
        for key in ("total", "elf", "repa", "reg", "lr", "grad_norm"):
            assert ma[key] == mb[key], (ma["step"], key)
    wa = open_checkpoint(tmp_path / "a").model_state()
    wb = open_checkpoint(tmp_path / "b").model_state()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_refuses_to_overwrite_and_to_resume_a_different_config(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train={"steps": 2, "out_dir": str(tmp_path / "r")})
    train(cfg, EXAMPLES)
    with pytest.raises(FileExistsError):
        train(cfg, EXAMPLES, resume=False)
    other = tiny_cfg(train={"steps": 2, "out_dir": str(tmp_path / "r")}, model={"depth": 1, "repa_block": 1})
    with pytest.raises(ValueError, match=r"\(model.depth: 2 in the checkpoint, 1 now\); set them"):
        train(other, EXAMPLES)
    other = tiny_cfg(train={"steps": 2, "out_dir": str(tmp_path / "r")}, data={"toy_count": 77})
    with pytest.raises(ValueError, match=r"\(data.toy_count: 20000 in the checkpoint, 77 now\); set them"):
        train(other, EXAMPLES)
    # a default that moved (a config that leaves the schedule to a newer elfreg) is named, not applied
    other = tiny_cfg(train={"steps": 4, "out_dir": str(tmp_path / "r"), "schedule": "constant", "lr": 2e-3})
    with pytest.raises(ValueError, match=r"^resuming would change the run's course \(train.lr: 0.001 in the "
                                         r"checkpoint, 0.002 now; train.schedule: 'cosine' in the checkpoint, "
                                         r"'constant' now\)"):
        train(other, EXAMPLES)
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["train"]["schedule"] == "cosine"
    # a cosine run made longer would jump back up its stretched schedule at the resumed step
    longer = {"steps": 4, "out_dir": str(tmp_path / "r"), "ckpt_every": 1, "log_every": 1}
    with pytest.raises(ValueError, match=r"\(the cosine schedule's length: 2 in the checkpoint, 4 now "
                                         r"\(train.decay_steps: 2 goes on at its floor\)\)"):
        train(tiny_cfg(train=longer), EXAMPLES)
    # going further at the schedule's floor, writing elsewhere and more often is how it is continued
    # (and where the data's files lie)
    longer = tiny_cfg(train={**longer, "decay_steps": 2}, data={"path": str(tmp_path / "moved")})
    train(longer, EXAMPLES)
    assert open_checkpoint(tmp_path / "r").meta["step"] == 4
    tc = longer.train
    assert [m["lr"] for m in metrics(tmp_path / "r") if m["step"] > 2] == [tc.lr * tc.min_lr_ratio] * 2


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_cfg, monkeypatch):
    cfg = tiny_cfg(train={"steps": 6, "ckpt_every": 2})
    poison_loss(monkeypatch, call=3, factor=float("nan"))
    with pytest.raises(TrainingDiverged, match="non-finite loss at step 3"):
        train(cfg, EXAMPLES)
    ckpt = open_checkpoint(cfg.train.out_dir)
    assert ckpt.meta["step"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt.model_state().values())


def test_crash_during_save_leaves_previous_checkpoint_loadable(tiny_cfg, monkeypatch):
    cfg = tiny_cfg(train={"steps": 4, "ckpt_every": 2})
    from elfreg import checkpoint as ck

    real_save = ck.torch.save
    calls = {"n": 0}

    def failing_save(obj, path, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            real_save(obj, path, *a, **k)
            raise OSError("disk full")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(ck.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        train(cfg, EXAMPLES)
    root = resolve_checkpoint(cfg.train.out_dir)
    assert root.name == "step-0000002"
    assert open_checkpoint(cfg.train.out_dir).load_student() is not None
    leftovers = [p.name for p in (root.parent).iterdir() if p.name.startswith(".tmp")]
    assert leftovers == []


def test_teacher_is_not_loaded_or_called_without_repa_and_reg(tiny_cfg, monkeypatch):
    from elfreg.text import frozen as frozen_mod

    def boom(*a, **k):
        raise AssertionError("teacher used")

    monkeypatch.setattr(frozen_mod.FrozenTeacher, "__init__", boom)
    monkeypatch.setattr(frozen_mod.FrozenTeacher, "targets", boom)
    cfg = tiny_cfg(model={"repa": False, "extra_token": "none"}, train={"steps": 3})
    result = train(cfg, EXAMPLES)
    assert result.step == 3 and math.isfinite(result.last_losses["total"])
    assert result.last_losses["repa"] == 0.0 and result.last_losses["reg"] == 0.0


@pytest.mark.parametrize("model", [{"repa": True, "extra_token": "none"}, {"repa": True, "extra_token": "learned"},
                                   {"repa": False, "extra_token": "reg"}])
def test_ablation_switches_train(tiny_cfg, model):
    cfg = tiny_cfg(model=model, train={"steps": 2}, text={"repa_shift": 1})
    result = train(cfg, EXAMPLES)
    assert math.isfinite(result.last_losses["total"])
    assert (result.last_losses["repa"] > 0) == model["repa"]
    assert (result.last_losses["reg"] > 0) == (model["extra_token"] == "reg")


def test_training_with_the_feature_cache_matches_training_without(tiny_cfg, tmp_path):
    runs = {}
    for cached in (False, True):
        cfg = tiny_cfg(train={"steps": 4, "batch_size": 3, "log_every": 1, "ckpt_every": 100,
                              "feature_cache": cached, "out_dir": str(tmp_path / str(cached))})
        train(cfg, EXAMPLES)
        runs[cached] = [m["total"] for m in metrics(tmp_path / str(cached))]
    assert runs[True] == pytest.approx(runs[False], rel=1e-4)


def test_the_first_step_logs_the_terms_its_zero_heads_imply(tiny_cfg, monkeypatch):
    """At step 1 the x̂ and r̂ heads are zero (ELF's initialisation), so x̂ = r̂ = 0 in every call,
    the auxiliary predictions of Eq. 8 agree and the SC-CFG target is the plain conditional one:
    Eq. 9's velocity error at an answer position is ‖x‖²/(d·c_t²), L_REG's per denoise row
    ‖r‖²/(d_r·c_t²), c_t = max(1 − t, c_min). The logged terms, recomputed from the micro-batches
    and the t drawn for them (no decode rows here), and L = L_ELF + 0.5·L_REPA + 0.1·L_REG."""
    cfg = tiny_cfg(train={"steps": 1, "batch_size": 3, "grad_accum": 2, "log_every": 1}, flow={"decode_prob": 0.0})
    batches, times = [], []
    real_loss, real_draw = step_module.elf_reg_loss, objective.sample_logit_normal

    def recording_loss(student, batch, *args, **kwargs):
        batches.append(batch)
        return real_loss(student, batch, *args, **kwargs)

    def recording_draw(shape, *args, **kwargs):
        drawn = real_draw(shape, *args, **kwargs)
        if len(shape) == 1:  # the rows' t (the other draw is λ, one per position)
            times.append(drawn)
        return drawn

    monkeypatch.setattr(step_module, "elf_reg_loss", recording_loss)
    monkeypatch.setattr(objective, "sample_logit_normal", recording_draw)
    (logged,) = metrics(train(cfg, EXAMPLES).run_dir)
    assert len(batches) == len(times) == 2
    denoise, reg = [], []
    for batch, t in zip(batches, times, strict=True):
        c = (1 - t).clamp(min=cfg.flow.c_min)
        x, r, answer = batch.x.float(), batch.teacher.reg.float(), batch.canvas.answer_mask
        per_position = x.pow(2).mean(-1) / c[:, None] ** 2
        denoise.append(float((per_position * answer).sum() / answer.sum()))
        reg.append(float((r.pow(2).mean(-1) / c**2).mean()))
    # the micro-batches' terms averaged; fp32 sums in another order (or bf16 matmuls elsewhere in
    # the step) move the last digits only
    assert logged["denoise"] == pytest.approx(sum(denoise) / 2, rel=1e-4)
    assert logged["elf"] == logged["denoise"] and logged["decode"] == 0.0
    assert logged["reg"] == pytest.approx(sum(reg) / 2, rel=1e-4)
    assert 0 < logged["repa"] < 2  # 1 − cos of a random projector's output
    assert logged["total"] == pytest.approx(logged["elf"] + 0.5 * logged["repa"] + 0.1 * logged["reg"], rel=1e-6)
    assert logged["lr"] == cfg.train.lr  # one warmup step: the peak


def test_a_kept_epochs_checkpoint_is_written_and_survives_rotation(tiny_cfg):
    """train.keep_epochs: the checkpoint of epoch E is written whatever ckpt_every says, linked as
    checkpoints/epoch-E and never pruned (the MATH recipe starts from GSM8K's at epoch 7.5)."""
    cfg = tiny_cfg(train={"steps": 9, "batch_size": 4, "ckpt_every": 4, "keep_epochs": [1.5], "log_every": 1})
    result = train(cfg, EXAMPLES)
    steps_of_epoch = -(-len(EXAMPLES) * 3 // (2 * 4))  # ceil(1.5 epochs / 4 per step)
    ckpts = result.run_dir / "checkpoints"
    kept = ckpts / f"step-{steps_of_epoch:07d}"
    assert steps_of_epoch % 4 != 0 and kept.is_dir()  # not a ckpt_every step: written for keep_epochs
    assert (ckpts / "epoch-1.5").resolve() == kept.resolve()
    names = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-"))
    assert names == sorted({kept.name, "step-0000004", "step-0000008", "step-0000009"})
    ckpt = open_checkpoint(ckpts / "epoch-1.5")
    assert ckpt.meta["step"] == steps_of_epoch and ckpt.meta["kept_epoch"] == 1.5
