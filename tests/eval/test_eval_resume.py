"""Streaming generation and resume: an interrupted ``elfreg eval --checkpoint`` (SIGINT, SIGTERM,
a second signal, kill -9) keeps every finished record, and running the same command again ends
with exactly the files of an uninterrupted run."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from eval_fakes import (
    FakeGenerator,
    eval_main,
    fake_checkpoint,
    gsm8k_file,
    problem_number,
    raise_on_call,
    signal_on_call,
)

from elfreg.eval import generation

PAIRS = 7 * 3  # 7 problems × 3 samples; chunks of lcm(batch 2, samples 3) = 6 jobs = 2 problems


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``run(out, generator)``: one ``elfreg eval`` of 7 problems × 3 samples with ``generator`` at the seam."""
    data, ckpt = gsm8k_file(tmp_path / "gsm8k.jsonl", 7), fake_checkpoint(tmp_path / "ckpt")

    def go(out: Path, generator: FakeGenerator, *extra: str) -> int:
        monkeypatch.setattr(generation, "_generate", generator)
        return eval_main(["--task", "gsm8k", "--source", str(data), "--checkpoint", str(ckpt), "--samples", "3",
                      "--batch-size", "2", "--out", str(out), "--no-progress", *extra])
    return go


def _summary(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("elapsed_s")
    return summary


def _assert_same_results(resumed: Path, reference: Path) -> None:
    for name in ("predictions.jsonl", "samples.jsonl", "table.txt", "eval_config.json"):
        assert (resumed / name).read_bytes() == (reference / name).read_bytes(), name
    assert _summary(resumed) == _summary(reference)


@pytest.fixture
def reference(run, tmp_path: Path) -> Path:
    """The uninterrupted run."""
    out = tmp_path / "reference"
    gen = FakeGenerator()
    assert run(out, gen) == 0
    assert len(gen.calls) == 4 and len((out / "predictions.jsonl").read_text().splitlines()) == PAIRS
    summary = _summary(out)
    assert summary["complete"] and summary["n_samples"] == PAIRS
    assert summary["pass@1"] == pytest.approx(14 / 21)  # (i + s) % 3 != 0 for 14 of the 21 pairs
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_after_the_chunk_and_the_rerun_resumes(run, reference: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture, sig: int) -> None:
    out = tmp_path / "out"
    assert run(out, FakeGenerator(on_call=signal_on_call(1, sig))) == 130  # the signal arrives during chunk 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"elfreg eval: stopped by {signal.Signals(sig).name}: generation stopped: 12 of {PAIRS} "
                   f"(task_id, seed) pairs are saved in {out / 'predictions.jsonl'}; run the same command again "
                   "to resume"]
    saved = (out / "predictions.jsonl").read_text().splitlines()
    assert saved == (reference / "predictions.jsonl").read_text().splitlines()[:12]  # chunks 1 and 2, whole
    assert not (out / "summary.json").exists()
    again = FakeGenerator()
    assert run(out, again) == 0
    assert [problem_number(c[0][0]) for c in again.calls] == [4, 6]  # only the missing chunks
    _assert_same_results(out, reference)


@pytest.fixture
def half_done(run, tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    """A run stopped at once (a second signal) at the start of its third chunk: 12 pairs saved
    (its stderr is left in ``capsys``)."""
    out = tmp_path / "out"
    assert run(out, FakeGenerator(on_call=raise_on_call(2))) == 130
    return out


def test_a_second_signal_stops_at_once_and_what_was_written_is_resumed(run, reference: Path, half_done: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "interrupted at once" in err[0] and "resumes" in err[0]
    assert len((half_done / "predictions.jsonl").read_text().splitlines()) == 12
    assert run(half_done, FakeGenerator()) == 0
    _assert_same_results(half_done, reference)


def test_a_last_line_cut_by_a_kill_is_dropped_with_a_warning(run, reference: Path, half_done: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    whole = (reference / "predictions.jsonl").read_text().splitlines(keepends=True)
    with (half_done / "predictions.jsonl").open("a") as f:
        f.write(whole[12][:20])  # the writer died mid-line
    with caplog.at_level(logging.WARNING, logger="elfreg.eval.generation"):
        assert run(half_done, FakeGenerator()) == 0
    assert "predictions.jsonl:13: dropped an incomplete last line" in caplog.text
    _assert_same_results(half_done, reference)


def test_a_corrupt_line_in_the_middle_is_an_error_naming_it(run, half_done: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    lines = (half_done / "predictions.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:10] + "\n"
    (half_done / "predictions.jsonl").write_text("".join(lines))
    capsys.readouterr()
    gen = FakeGenerator()
    assert run(half_done, gen) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"{half_done / 'predictions.jsonl'}:3: not valid JSON" in err[0] and gen.calls == []


# generates two chunks (12 pairs saved), then blocks in its third call until it is killed
KILLED = textwrap.dedent("""
    import sys
    from eval_fakes import FakeGenerator
    from elfreg.eval import generation
    from elfreg.cli import main
    generation._generate = FakeGenerator(on_call=lambda n: n == 2 and sys.stdin.read())
    sys.exit(main(["eval", *sys.argv[1:]]))
""")


def test_kill_9_mid_run_then_the_same_command_resumes(run, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--task", "gsm8k", "--source", str(tmp_path / "gsm8k.jsonl"), "--checkpoint", str(tmp_path / "ckpt"),
            "--samples", "3", "--batch-size", "2", "--out", str(out), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, *argv], env=env, stdin=subprocess.PIPE)
    path = out / "predictions.jsonl"
    try:  # wait for the two chunks (or the child's end, which the asserts below then report)
        while proc.poll() is None and not (path.exists() and len(path.read_bytes().splitlines()) >= 12):
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    assert len(path.read_bytes().splitlines()) == 12 < PAIRS, "the run should have been killed mid-way"
    assert run(out, FakeGenerator()) == 0
    _assert_same_results(out, reference)


def test_a_real_checkpoint_interrupted_and_resumed_matches_an_uninterrupted_run(
        tiny_assets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elfreg.data.examples import Example
    from elfreg.train.loop import train

    from conftest import tiny_config

    cfg = tiny_config(tiny_assets, tmp_path, train={"steps": 2, "ckpt_every": 2}, sample={"nfe": 6})
    train(cfg, [Example(f"add {a} {b}", f"#### {a + b}") for a, b in [(1, 2), (3, 4)]])
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"add {i} 1", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(3)))
    argv = ["--task", "gsm8k", "--source", str(data), "--checkpoint", cfg.train.out_dir, "--samples", "2",
            "--batch-size", "2", "--no-progress"]  # chunks of one problem
    assert eval_main([*argv, "--out", str(tmp_path / "reference")]) == 0
    real = generation._generate
    calls = []

    def interrupted(*args):
        calls.append(args[1])
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # stop after this chunk
        return real(*args)

    monkeypatch.setattr(generation, "_generate", interrupted)
    out = tmp_path / "out"
    assert eval_main([*argv, "--out", str(out)]) == 130
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 4
    assert eval_main([*argv, "--out", str(out)]) == 0
    assert len(calls) == 3  # the rerun generated only the third problem
    _assert_same_results(out, tmp_path / "reference")
    texts = [json.loads(line)["solution"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(texts) == 6
