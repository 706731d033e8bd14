"""``elfreg distill`` end to end: configs/tiny.yaml's student distilled round by round into
checkpoints that ``elfreg sample`` and ``elfreg.load`` (the server's loader) read; what each round
starts from and what it leaves untouched; slices and resumes giving the uninterrupted run's
losses and weights; refusals in one line; two ranks training what one process trains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import metrics

import elfreg
from elfreg.checkpoint import open_checkpoint
from elfreg.cli import main
from elfreg.config import Config, ConfigError
from elfreg.train.distill import distill, distill_config

from conftest import torchrun

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TERMS = ("total", "elf", "denoise", "decode", "reg", "grad_norm")


@pytest.fixture(scope="module")
def teacher(tiny_assets, tmp_path_factory) -> Path:
    """configs/tiny.yaml's student (the REPA projector and the REG token) on the tests' tiny LMs,
    trained 6 steps: its weights and EMA differ."""
    root = tmp_path_factory.mktemp("teacher")
    assert main(["train", "--config", str(CONFIGS / "tiny.yaml"), f"text.encoder={tiny_assets['encoder']}",
                 f"text.teacher={tiny_assets['teacher']}", "data.toy_count=64", "train.steps=6", "train.batch_size=8",
                 "train.ckpt_every=6", "train.progress=false", f"train.out_dir={root / 'tiny'}"]) == 0
    return root / "tiny"


def _config(teacher: Path, out: Path, *overrides: str) -> Config:
    return distill_config(open_checkpoint(teacher).config, CONFIGS / "distill-tiny.yaml",
                          [f"train.out_dir={out}", "train.steps=3", "train.batch_size=8", "train.ckpt_every=2",
                           "train.log_every=1", "train.progress=false", *overrides])


def test_tiny_yamls_student_distils_into_checkpoints_that_sample_and_load(teacher, tmp_path, capsys):
    out = tmp_path / "distilled"
    assert main(["distill", "--checkpoint", str(teacher), "--config", str(CONFIGS / "distill-tiny.yaml"),
                 f"train.out_dir={out}", "train.steps=3", "train.batch_size=8", "train.ckpt_every=3",
                 "train.log_every=1", "train.progress=false"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in said] == ["round 1", "round 2"]
    aux = "flops_per_token.self_cond_aux"
    for k, steps, sub_steps in ((1, 4, 4), (2, 2, 8)):
        folder = out / f"round{k}-{steps}step"
        rows = metrics(folder)
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(math.isfinite(r[t]) for r in rows for t in TERMS) and any(r["denoise"] > 0 for r in rows)
        # the teacher's calls, (1 − p_decode)(p_sc + K) per example, against training's two
        # self-conditioning passes, 2(1 − p_decode)p_sc, at p_sc 0.5
        assert rows[-1][aux] / metrics(teacher)[-1][aux] == pytest.approx(0.5 + sub_steps)
        ckpt = open_checkpoint(folder)
        assert ckpt.meta["distilled"]["student_steps"] == steps and ckpt.meta["distilled"]["round"] == k
        assert (ckpt.config.sample.sampler, ckpt.config.sample.nfe) == ("sde", steps + 1)  # ELF's few-step setting
    last = out / "round2-2step"
    assert main(["sample", "--checkpoint", str(last), "--prompt", "12+7=", "--prompt", "3+4=", "--no-progress",
                 "--out", str(tmp_path / "answers")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "answers" / "samples.jsonl").read_text().splitlines()]
    assert [(r["sampler"], r["denoiser_calls"], r["decoder_calls"]) for r in rows] == [("sde", 2, 1)] * 2
    served = elfreg.load(last)
    results = served.sample(["12+7="], samples=2)
    assert [r.nfe for r in results] == [3, 3] and all(isinstance(r.text, str) for r in results)


def test_each_round_starts_from_the_last_rounds_ema_and_leaves_the_projector_alone(teacher, tmp_path):
    """At a learning rate too small to move a weight, a round ends where it started: round 1 at
    the teacher's EMA (not its weights), round 2 at round 1's EMA; the REPA projector, no term of
    the distillation loss, is the teacher's exactly."""
    cfg = _config(teacher, tmp_path / "d", "train.lr=1e-12", "train.warmup_steps=0")
    results = distill(cfg, teacher)
    assert [r.finished for r in results] == [True, True]
    taught = open_checkpoint(teacher)
    ema, weights = taught.ema_state(), taught.model_state()
    assert max(float((ema[k] - weights[k]).abs().max()) for k in ema) > 1e-3
    first, second = (open_checkpoint(r.folder) for r in results)
    for start, ckpt in ((ema, first), (first.ema_state(), second)):
        got = ckpt.model_state()
        assert max(float((got[k] - start[k]).abs().max()) for k in got) < 1e-6
    projector = [k for k in ema if k.startswith("projector.")]
    assert projector and all(torch.equal(second.model_state()[k], ema[k]) for k in projector)
    assert all(torch.equal(second.ema_state()[k], ema[k]) for k in projector)
    # the REG statistics of every round are the teacher's
    assert torch.equal(second.train_state()["reg_mean"], taught.train_state()["reg_mean"])


def test_slices_and_resumes_give_the_uninterrupted_runs_losses_and_weights(teacher, tmp_path):
    straight = distill(_config(teacher, tmp_path / "straight"), teacher)
    cfg = _config(teacher, tmp_path / "sliced")
    first = distill(cfg, teacher, stop_at=2)  # in round 1
    assert [(r.round, r.step, r.finished) for r in first] == [(1, 2, False)]
    second = distill(cfg, teacher, stop_at=4)  # finishes round 1, stops in round 2
    assert [(r.round, r.step) for r in second] == [(1, 3), (2, 1)]
    rest = distill(cfg, teacher)
    assert [(r.round, r.step, r.finished) for r in rest] == [(1, 3, True), (2, 3, True)]
    assert rest[0].losses == {}  # a finished round is not run again
    for a, b in zip(straight, rest, strict=True):
        ma, mb = metrics(a.folder), metrics(b.folder)
        assert [{k: m[k] for k in TERMS} for m in ma] == [{k: m[k] for k in TERMS} for m in mb]
        wa, wb = load_file(a.folder / "checkpoints" / "step-0000003" / "ema.safetensors"), \
            load_file(b.folder / "checkpoints" / "step-0000003" / "ema.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_refusals_are_one_line(teacher, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    cases = [("model: {width: 64}\ntrain: {out_dir: x}\n", "model: a distilled student is its teacher's network"),
             ("distill: {student_steps: [4]}\n", "train.out_dir: give the folder"),
             ("train: {out_dir: x, init_from: y}\n", "train.init_from: a distillation starts from its teacher"),
             ("distill: {student_steps: [4, 2], teacher_steps: [4]}\ntrain: {out_dir: x}\n",
              "distill.teacher_steps: must give one count per round"),
             ("distill: {student_steps: [0]}\ntrain: {out_dir: x}\n", "distill.student_steps: must list")]
    for text, message in cases:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            distill_config(open_checkpoint(teacher).config, bad)
        assert main(["distill", "--checkpoint", str(teacher), "--config", str(bad)]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    done = _config(teacher, tmp_path / "d", "distill.student_steps=4", "distill.teacher_steps=4")
    distill(done, teacher)
    with pytest.raises(FileExistsError, match="--fresh"):
        distill(done, teacher, resume=False)
    other = _config(teacher, tmp_path / "d", "distill.student_steps=4", "distill.teacher_steps=2")
    with pytest.raises(ValueError, match="distilled with teacher_steps 4, this distillation's is 2"):
        distill(other, teacher)


def test_two_ranks_distil_what_one_process_distils(teacher, tmp_path):
    one = _config(teacher, tmp_path / "one", "distill.student_steps=2", "distill.teacher_steps=2",
                  "train.device=cpu", "train.precision=fp32")
    distill(one, teacher)
    proc = torchrun(["distill", "--checkpoint", str(teacher), "--config", str(CONFIGS / "distill-tiny.yaml"),
                     f"train.out_dir={tmp_path / 'two'}", "train.steps=3", "train.batch_size=8", "train.ckpt_every=2",
                     "train.log_every=1", "train.progress=false", "distill.student_steps=2",
                     "distill.teacher_steps=2", "train.device=cpu", "train.precision=fp32", "train.parallel=ddp"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("round 1:") == 1  # rank 0 alone reports
    a, b = metrics(tmp_path / "one" / "round1-2step"), metrics(tmp_path / "two" / "round1-2step")
    # relative to the term, or to 1e-4 for the terms near 0 (the student starts as its teacher, so its
    # regression terms start near 1e-6, where the rounding of split batches is 3e-10)
    worst = max(abs(x[t] - y[t]) / max(abs(x[t]), 1e-4) for x, y in zip(a, b, strict=True) for t in TERMS)
    assert len(a) == len(b) == 3 and worst < 1e-4, worst
