"""What elfreg guarantees about a training run folder (docs/reliability.md): resume from the
newest intact checkpoint, locks, interrupts, disk full, and one line for every failure."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from train_helpers import EXAMPLES, metrics

from elfreg.checkpoint import CheckpointError, CheckpointWarning, checkpoint_problem, open_checkpoint
from elfreg.cli import main
from elfreg.runs import FolderInUse, locked
from elfreg.train.loop import train


def _steps(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))


def _weights(run_dir) -> dict[str, torch.Tensor]:
    return open_checkpoint(run_dir).model_state()


@pytest.fixture
def trained(tiny_cfg):
    """A 6-step run with checkpoints at 2, 4 and 6."""
    cfg = tiny_cfg(train={"steps": 6, "ckpt_every": 2, "log_every": 1})
    train(cfg, EXAMPLES)
    return cfg, Path(cfg.train.out_dir)


@pytest.mark.parametrize("damage", ["latest missing", "latest garbled", "newest deleted", "newest truncated",
                                    "meta step edited"])
def test_resume_uses_the_newest_intact_checkpoint_and_keeps_the_older_ones(trained, tiny_cfg, damage):
    cfg, run = trained
    root = run / "checkpoints"
    older = {name: (root / name / "model.safetensors").read_bytes() for name in ("step-0000002", "step-0000004")}
    if damage == "latest missing":
        (root / "latest").unlink()
        expect = 6
    elif damage == "latest garbled":
        (root / "latest").write_bytes(b"\xff\x00nonsense")
        expect = 6
    elif damage == "newest deleted":
        shutil.rmtree(root / "step-0000006")
        expect = 4
    elif damage == "newest truncated":
        path = root / "step-0000006" / "ema.safetensors"
        path.write_bytes(path.read_bytes()[:-100])
        assert "truncated" in checkpoint_problem(root / "step-0000006")
        expect = 4
    else:
        meta = root / "step-0000006" / "meta.json"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "step": 60}))
        expect = 4
    with pytest.warns(CheckpointWarning):
        assert open_checkpoint(run).meta["step"] == expect
    longer = tiny_cfg(train={"steps": 8, "decay_steps": 6, "ckpt_every": 2, "log_every": 1})  # on at the floor
    with pytest.warns(CheckpointWarning):
        result = train(longer, EXAMPLES)
    assert result.step == 8
    # the run went on from `expect`, without touching the older intact checkpoints
    for name, data in older.items():
        if (root / name).exists():
            assert (root / name / "model.safetensors").read_bytes() == data
    assert [m["step"] for m in metrics(run)] == list(range(1, 9))  # no duplicate or missing lines
    assert not list(root.glob(".tmp-*"))


def test_resumed_metrics_are_cut_back_and_stale_temporaries_removed(trained, tiny_cfg):
    cfg, run = trained
    shutil.rmtree(run / "checkpoints" / "step-0000006")  # the run dies between its log and its save
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "tot')  # ... in the middle of a log line
    (run / "checkpoints" / ".tmp-step-0000008-x").mkdir()
    (run / "checkpoints" / ".latest.abc").write_text("junk")
    train(tiny_cfg(train={"steps": 6, "ckpt_every": 2, "log_every": 1}), EXAMPLES)
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-0000002", "step-0000004",
                                                                      "step-0000006"]


def test_fresh_refuses_any_checkpoint_and_a_folder_of_broken_ones_is_not_restarted(trained, tiny_cfg):
    cfg, run = trained
    with pytest.raises(FileExistsError, match="--fresh"):
        train(cfg, EXAMPLES, resume=False)
    for step in ("step-0000002", "step-0000004", "step-0000006"):
        (run / "checkpoints" / step / "model.safetensors").write_bytes(b"")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(CheckpointError, match="none is intact"), pytest.warns(CheckpointWarning):
        train(cfg, EXAMPLES)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


def test_a_second_process_on_the_same_run_folder_refuses(tiny_cfg, capsys):
    cfg = tiny_cfg(train={"steps": 2})
    with locked(cfg.train.out_dir):
        with pytest.raises(FolderInUse, match=f"pid {os.getpid()}"):
            train(cfg, EXAMPLES)
    assert not (Path(cfg.train.out_dir) / "checkpoints").exists()


def test_a_truncated_safetensors_file_is_named(trained):
    _, run = trained
    path = run / "checkpoints" / "step-0000006" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        open_checkpoint(path.parent).model_state()


def _write_config(cfg, path: Path) -> Path:
    cfg.save(path)
    return path


# `elfreg` whose sixth step waits until the first signal has been handled: the signal lands after
# five logged steps, whatever the machine's speed, and the run stops after step 6
WAITS_FOR_THE_SIGNAL = textwrap.dedent("""
    import sys, threading
    from elfreg.cli import main
    from elfreg.runs import GracefulInterrupt
    from elfreg.train import loop
    handled = threading.Event()
    real_handle, real_step = GracefulInterrupt._handle, loop.train_step
    def handle(self, signum, frame):
        real_handle(self, signum, frame)
        handled.set()
    def step(run, index):
        if index == 5:
            handled.wait()
        return real_step(run, index)
    GracefulInterrupt._handle, loop.train_step = handle, step
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_checkpoints_the_step_and_the_resumed_run_equals_an_uninterrupted_one(tiny_cfg, tmp_path, sig):
    steps = 60
    common = {"steps": steps, "ckpt_every": 1000, "log_every": 1}
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in EXAMPLES))
    source = {"source": "jsonl", "path": str(data)}
    cut = tiny_cfg(train={**common, "out_dir": str(tmp_path / "cut")}, data=source)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", WAITS_FOR_THE_SIGNAL, "train", "--config",
                             str(_write_config(cut, tmp_path / "cut.yaml"))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    log = Path(cut.train.out_dir) / "metrics.jsonl"
    while proc.poll() is None and (not log.exists() or len(log.read_text().splitlines()) < 5):
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"interrupted by {sig.name} after step" in lines[0] and "resume" in lines[0], err
    stopped = open_checkpoint(cut.train.out_dir).meta["step"]
    assert stopped == 6 and f"step-{stopped:07d}" in lines[0]

    torch.set_num_threads(1)
    assert train(cut).step == steps  # resume in-process, to the end
    straight = tiny_cfg(train={**common, "out_dir": str(tmp_path / "straight")}, data=source)
    train(straight)
    a, b = _weights(straight.train.out_dir), _weights(cut.train.out_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [m["total"] for m in metrics(Path(straight.train.out_dir))] == [
        m["total"] for m in metrics(Path(cut.train.out_dir))]


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_disk_full_gives_one_line_and_keeps_the_previous_checkpoint(tiny_cfg, tmp_path, capsys):
    disk = tmp_path / "small"
    probe = tiny_cfg(train={"steps": 2, "ckpt_every": 2, "out_dir": str(tmp_path / "probe")})
    train(probe, EXAMPLES)
    size = sum(f.stat().st_size for f in (tmp_path / "probe" / "checkpoints" / "step-0000002").iterdir())
    if not _mount_tmpfs(disk, f"size={int(size * 1.6)}"):
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        cfg = tiny_cfg(train={"steps": 4, "ckpt_every": 2, "out_dir": str(disk / "run")})
        capsys.readouterr()  # what the probe run printed
        rc = main(["train", "--config", str(_write_config(cfg, tmp_path / "c.yaml"))])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert rc == 1 and len(err) == 1 and "disk full while writing checkpoint" in err[0], err
        assert "step-0000004" in err[0]
        assert open_checkpoint(disk / "run").meta["step"] == 2  # the previous checkpoint is intact
        assert not list((disk / "run" / "checkpoints").glob(".tmp-*"))
    finally:
        subprocess.run(["umount", str(disk)], check=False)
