"""Data parallelism under torchrun (2 CPU ranks, gloo) against one process: the same losses and
weights (world-size invariance), resume at another world size, a rank killed mid-save."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from train_helpers import metrics

from elfreg.checkpoint import is_sharded, open_checkpoint, resolve_checkpoint
from elfreg.data.examples import Example
from elfreg.distributed import GRACE_ENV
from elfreg.train.loop import train

from conftest import tiny_config, torchrun

EXAMPLES = [Example(f"add {a} {b}", f"{a}+{b}={a + b}") for a, b in
            [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2), (8, 1), (4, 4), (9, 0), (6, 3), (1, 1), (2, 7), (3, 3)]]
TERMS = ("total", "elf", "denoise", "decode", "repa", "reg", "grad_norm")


@pytest.fixture
def dist_cfg(tiny_assets, tmp_path):
    """A config of 4 examples per global micro-batch, 2 micro-batches per step, on a JSONL file
    that every rank reads (fp32 on the CPU)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in EXAMPLES))

    def make(name: str, **train_cfg):
        cfg = tiny_config(tiny_assets, tmp_path, data={"source": "jsonl", "path": str(data)},
                          train={"batch_size": 4, "grad_accum": 2, "device": "cpu", "precision": "fp32",
                                 "out_dir": str(tmp_path / name), "log_every": 1, **train_cfg})
        cfg.save(tmp_path / f"{name}.yaml")
        return cfg, tmp_path / f"{name}.yaml"
    return make


def _dir(cfg) -> Path:
    return Path(cfg.train.out_dir)


def _close(a: list[dict], b: list[dict], rel: float = 1e-4) -> float:
    """The largest relative difference of the loss terms of two runs' metrics (same steps)."""
    assert [m["step"] for m in a] == [m["step"] for m in b]
    worst = 0.0
    for ma, mb in zip(a, b, strict=True):
        for key in TERMS:
            worst = max(worst, abs(ma[key] - mb[key]) / max(abs(ma[key]), 1e-8))
    assert worst <= rel, worst
    return worst


def _weights_close(a, b, tol: float = 1e-4) -> float:
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    worst = 0.0
    for fetch in ("model_state", "ema_state"):
        wa, wb = getattr(ca, fetch)(), getattr(cb, fetch)()
        assert wa.keys() == wb.keys()
        worst = max(worst, max(float((wa[k] - wb[k]).abs().max()) for k in wa))
    assert worst <= tol, worst
    return worst


@pytest.mark.parametrize("mode", ["ddp", "fsdp2", "fsdp2+shard_frozen+activation_checkpointing", "ddp+muon"])
def test_two_ranks_train_what_one_process_trains(dist_cfg, mode):
    steps = 20
    optimizer = "muon" if "muon" in mode else "adamw"
    one, _ = dist_cfg("one", steps=steps, ckpt_every=steps, optimizer=optimizer)
    train(one, EXAMPLES)
    two, path = dist_cfg(mode, steps=steps, ckpt_every=10, parallel=mode.split("+")[0], optimizer=optimizer)
    extra = ["text.shard_frozen=true", "train.activation_checkpointing=true"] if "shard" in mode else []
    proc = torchrun(["train", "--config", str(path), *extra])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("trained to step 20") == 1  # rank 0 alone reports
    loss_rel = _close(metrics(_dir(two)), metrics(_dir(one)))
    assert is_sharded(resolve_checkpoint(_dir(two)))
    # measured: weights within 1.2e-6 (AdamW) and 1.2e-7 (ELF's Muon, fp32 Newton-Schulz)
    weight_abs = _weights_close(_dir(two), _dir(one), tol=1e-5)
    print(f"{mode}: 2 ranks vs 1 process, {steps} steps: losses rel {loss_rel:.2e}, weights abs {weight_abs:.2e}")
    # every loss term moved: this is a real comparison, not two empty runs
    first, last = metrics(_dir(one))[0], metrics(_dir(one))[-1]
    assert last["total"] != first["total"] and all("tokens_per_s" in m and "mfu" in m for m in metrics(_dir(two)))


@pytest.mark.parametrize(("first", "second"), [("fsdp2", "none"), ("none", "ddp")])
def test_a_run_stopped_at_one_world_size_resumes_at_another(dist_cfg, first, second):
    """2 ranks → 1 process and 1 process → 2 ranks continue with the uninterrupted run's losses
    (a constant schedule, so that the first part can stop at step 4 by its own train.steps)."""
    straight, _ = dist_cfg("straight", steps=8, ckpt_every=8, schedule="constant")
    train(straight, EXAMPLES)
    sliced, path = dist_cfg("sliced", steps=8, ckpt_every=2, schedule="constant")

    def part(mode: str, steps: int) -> None:
        if mode == "none":
            train(sliced.__class__.from_dict({**sliced.to_dict(), "train": {**sliced.to_dict()["train"],
                                                                              "steps": steps}}), EXAMPLES)
        else:
            proc = torchrun(["train", "--config", str(path), f"train.steps={steps}", f"train.parallel={mode}"])
            assert proc.returncode == 0, proc.stderr[-3000:]

    part(first, 4)
    assert open_checkpoint(_dir(sliced)).meta["step"] == 4
    part(second, 8)
    assert [m["step"] for m in metrics(_dir(sliced))] == list(range(1, 9))
    loss_rel = _close(metrics(_dir(sliced)), metrics(_dir(straight)))
    weight_abs = _weights_close(_dir(sliced), _dir(straight))
    print(f"{first} -> {second}: losses rel {loss_rel:.2e}, weights abs {weight_abs:.2e}")


KILLER = textwrap.dedent("""
    # rank 1 kills itself with SIGKILL once its shard of the checkpoint named in $KILL_AT is
    # written, before the save is complete
    import os, signal, sys
    from torch.distributed.checkpoint import FileSystemWriter

    real = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        fut = real(self, plan, planner)
        fut.wait()
        if os.environ["RANK"] == "1" and os.environ["KILL_AT"] in str(self.path):
            os.kill(os.getpid(), signal.SIGKILL)
        return fut

    FileSystemWriter.write_data = write_data
    from elfreg.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint_and_the_run_resumes(dist_cfg, tmp_path):
    straight, _ = dist_cfg("straight", steps=6, ckpt_every=2)
    train(straight, EXAMPLES)
    cfg, path = dist_cfg("killed", steps=6, ckpt_every=2, parallel="fsdp2")
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    proc = torchrun(["train", "--config", str(path)], script=killer, env={"KILL_AT": "step-0000004"})
    assert proc.returncode != 0
    ckpts = _dir(cfg) / "checkpoints"
    assert resolve_checkpoint(_dir(cfg)).name == "step-0000002"  # the previous one, intact
    assert (ckpts / "latest").read_text() == "step-0000002"
    assert [p for p in ckpts.iterdir() if p.name.startswith(".tmp-step-0000004")]  # the cut save
    state = open_checkpoint(_dir(cfg)).model_state()
    assert all(torch.isfinite(v).all() for v in state.values())
    proc = torchrun(["train", "--config", str(path)])  # the same command resumes
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp")]
    loss_rel = _close(metrics(_dir(cfg)), metrics(_dir(straight)))
    weight_abs = _weights_close(_dir(cfg), _dir(straight))
    print(f"killed and resumed: losses rel {loss_rel:.2e}, weights abs {weight_abs:.2e}")


POISON = textwrap.dedent("""
    # the 3rd loss of rank 1 (step 2, first micro-batch) is NaN; rank 0's are finite
    import os, sys
    from elfreg.train import step

    real, calls = step.elf_reg_loss, {"n": 0}

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        if os.environ["RANK"] == "1" and calls["n"] == 3:
            out.total = out.total * float("nan")
        return out

    step.elf_reg_loss = poisoned
    from elfreg.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize(("override", "named"), [
    ("train.batch_size=3", "train.batch_size (3) is the global micro-batch and must be divisible by the number of "
                           "ranks (2)"),
    ("data.path=/nonexistent/data.jsonl", "/nonexistent/data.jsonl"),
    ("train.lr=-1", "config error: train.lr: must be > 0"),
    ("poison", "non-finite loss at step 2"),
])
def test_every_rank_fails_with_one_line_naming_it(dist_cfg, tmp_path, override, named):
    """A bad setting, a missing file, a non-finite loss on one rank: every rank stops with one
    line naming it and the failure, no traceback."""
    _, path = dist_cfg("bad", steps=3, parallel="ddp")
    script = None
    if override == "poison":
        script = tmp_path / "poison.py"
        script.write_text(POISON)
    proc = torchrun(["train", "--config", str(path)] + ([override] if script is None else []), script=script)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rank ")]
    assert sorted(ln.split(":")[0] for ln in lines) == ["rank 0/2", "rank 1/2"], proc.stderr
    assert all(named in ln for ln in lines), lines
    # no rank printed a traceback (torchrun prints its own summary of the failed ranks)
    assert not [ln for ln in proc.stderr.splitlines() if ln.strip().startswith("File") and "/elfreg/" in ln]


SLOW_RANK = textwrap.dedent("""
    # rank 1 starts only once rank 0 has failed (and is waiting in torchrun's store), so it is
    # certainly the slower one
    import os, sys, time
    from elfreg.cli import main
    from elfreg.distributed import failed_ranks
    if os.environ["RANK"] == "1":
        while failed_ranks() < 1:
            time.sleep(0.05)
    sys.exit(main(sys.argv[1:]))
""")


def test_a_slow_rank_still_says_its_line_before_torchrun_stops_it(dist_cfg, tmp_path):
    """torchrun stops the other ranks once one exits non-zero: the first rank to fail waits (in
    torchrun's store) for the others to fail too, so a slower rank is not killed mid-way."""
    _, path = dist_cfg("slow", steps=3, parallel="ddp")
    script = tmp_path / "slow_rank.py"
    script.write_text(SLOW_RANK)
    proc = torchrun(["train", "--config", str(path), "train.lr=-1"], script=script)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rank ")]
    assert proc.returncode != 0, proc.stderr
    assert sorted(ln.split(":")[0] for ln in lines) == ["rank 0/2", "rank 1/2"], proc.stderr


LONE_FAILURE = textwrap.dedent("""
    # rank 1 fails alone; rank 0 would wait for it at its first collective
    import os, sys
    if os.environ["RANK"] == "1":
        sys.argv.append("train.lr=-1")
    from elfreg.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_rank_failing_alone_stops_the_job_after_the_grace(dist_cfg, tmp_path):
    """A failure on one rank only: that rank says its line and the job still ends (after a grace
    set short here), rather than hanging on the ranks that wait for it (the run's timeout would
    fail the test)."""
    _, path = dist_cfg("lone", steps=3, parallel="ddp")
    script = tmp_path / "lone.py"
    script.write_text(LONE_FAILURE)
    proc = torchrun(["train", "--config", str(path)], script=script, timeout=180, env={GRACE_ENV: "1"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rank ")]
    assert proc.returncode != 0
    assert [ln.split(":")[0] for ln in lines] == ["rank 1/2"], proc.stderr
    assert "train.lr: must be > 0" in lines[0]


def test_sigterm_to_torchrun_stops_every_rank_after_the_same_step_with_a_checkpoint(dist_cfg):
    """torchrun passes SIGTERM to its ranks; they agree on the step, checkpoint it and exit with
    one line each; the same command resumes (a constant schedule, so the resumed part can end a
    few steps later by its own train.steps and be compared with a straight run)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg, path = dist_cfg("signalled", steps=100_000, ckpt_every=100_000, schedule="constant", parallel="ddp")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--no-python",
              str(Path(sys.executable).parent / "elfreg"), "train", "--config", str(path)]
    proc = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    log = _dir(cfg) / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    stopped = [ln for ln in err.splitlines() if ln.startswith("rank ") and "interrupted by SIGTERM" in ln]
    assert len(stopped) == 2, err[-2000:]
    step = open_checkpoint(_dir(cfg)).meta["step"]
    assert all(f"after step {step};" in ln for ln in stopped)
    assert metrics(_dir(cfg))[-1]["step"] == step
    proc = torchrun(["train", "--config", str(path), f"train.steps={step + 2}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    straight, _ = dist_cfg("straight", steps=step + 2, ckpt_every=100_000, schedule="constant")
    train(straight, EXAMPLES)
    _close(metrics(_dir(cfg)), metrics(_dir(straight)))
