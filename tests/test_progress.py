"""``--no-progress`` silences every progress bar: elfreg's own and the libraries' (transformers'
"Loading weights" and "Writing model shards", huggingface_hub's, datasets'), in this process and
in the ones it starts (elfreg.progress)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging

from elfreg.progress import BARS_OFF_ENV, library_bars, silence_library_bars

BAR_MARKS = ("it/s]", "s/it]", "%|")  # what tqdm writes, to a terminal or not


def _bars(text: str) -> list[str]:
    return [line for line in text.replace("\r", "\n").splitlines() if any(mark in line for mark in BAR_MARKS)]


@pytest.fixture
def bars_as_a_new_process_has_them(monkeypatch):
    """The environment of a process nobody has silenced, and transformers' bars on; both restored."""
    for name in BARS_OFF_ENV:
        monkeypatch.delenv(name, raising=False)
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    yield
    (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()


@pytest.fixture(scope="module")
def checkpoint(tiny_assets, tmp_path_factory):
    from elfreg.train.loop import train

    from conftest import tiny_config

    root = tmp_path_factory.mktemp("progress")
    cfg = tiny_config(tiny_assets, root, data={"source": "toy-arith", "toy_count": 8},
                      text={"canvas_len": 40, "prompt_cap": 30}, train={"steps": 1, "ckpt_every": 1})
    train(cfg)
    return cfg.train.out_dir


def _run(*argv: str) -> str:
    """stderr of ``elfreg ARGV`` in a process of its own, with --debug (which leaves the libraries'
    bars as they are: only --no-progress may turn them off)."""
    elfreg = Path(sys.executable).parent / "elfreg"
    env = {k: v for k, v in os.environ.items() if k not in BARS_OFF_ENV}
    proc = subprocess.run([str(elfreg), *argv, "--debug"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def _sample(checkpoint: Path, out: Path, *flags: str) -> str:
    return _run("sample", "--checkpoint", str(checkpoint), "--prompt", "1+2=", "--nfe", "4", "--out", str(out), *flags)


def test_no_progress_silences_elfregs_bars_and_the_libraries(checkpoint, tmp_path):
    shown = _sample(checkpoint, tmp_path / "shown")
    assert any("Loading weights" in line for line in _bars(shown))  # the check below can fail
    assert _bars(_sample(checkpoint, tmp_path / "quiet", "--no-progress")) == []


def test_silenced_bars_stay_off_here_and_in_child_processes(bars_as_a_new_process_has_them):
    from huggingface_hub.utils import are_progress_bars_disabled

    silence_library_bars()
    assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    assert {k: os.environ[k] for k in BARS_OFF_ENV} == BARS_OFF_ENV
    child = ("from transformers.utils import logging; import datasets.utils as d; "
             "print(logging.is_progress_bar_enabled(), d.are_progress_bars_disabled())")
    assert subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          check=True).stdout.split() == ["False", "True"]


def test_library_bars_follow_progress_inside_the_block_only(bars_as_a_new_process_has_them):
    with library_bars(False):
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    with library_bars(True):
        assert hf_logging.is_progress_bar_enabled()


def test_train_and_distill_take_no_progress_too(checkpoint, tmp_path):
    """``elfreg train`` and ``elfreg distill`` accept --no-progress (as ``train.progress=false``):
    their step bars and the libraries' loading bars stay off."""
    import yaml

    cfg = yaml.safe_load((Path(checkpoint) / "config.yaml").read_text())
    cfg["train"].update(out_dir=str(tmp_path / "run"), steps=2, ckpt_every=2, progress=True)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    assert _bars(_run("train", "--config", str(tmp_path / "train.yaml"))) != []  # the check below can fail
    assert _bars(_run("train", "--config", str(tmp_path / "train.yaml"), "--no-progress",
                      f"train.out_dir={tmp_path / 'quiet'}")) == []
    distill = {"distill": {"student_steps": [2], "teacher_steps": [2]},
               "train": {"out_dir": str(tmp_path / "distilled"), "steps": 2, "batch_size": 4, "ckpt_every": 2,
                         "optimizer": "adamw", "lr": 1e-3, "schedule": "constant", "warmup_steps": 1}}
    (tmp_path / "distill.yaml").write_text(yaml.safe_dump(distill))
    assert _bars(_run("distill", "--checkpoint", str(checkpoint), "--config", str(tmp_path / "distill.yaml"),
                      "--no-progress")) == []
