"""Every expected failure of ``elfreg eval`` is one line on stderr that names the offending file or
key, with a non-zero exit status and no traceback (through the ``elfreg`` entry point)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from eval_fakes import fake_checkpoint, gsm8k_file

from elfreg.cli import main
from lock_holder import held_lock


@pytest.fixture
def held_folder() -> Iterator[Callable[[Path], int]]:
    """``hold(folder) -> pid`` locks ``folder`` from another process for the test."""
    with ExitStack() as holders:
        yield lambda folder: holders.enter_context(held_lock(folder)).pid


def _cases(tmp: Path, hold: Callable[[Path], int]) -> dict[str, tuple[list[str], str]]:
    """name → (arguments after ``eval``, text the error line must contain)."""
    data = gsm8k_file(tmp / "gsm8k.jsonl", 2)
    task = ["--task", "gsm8k", "--source", str(data)]
    good = tmp / "good.jsonl"
    good.write_text('{"task_id": "gsm8k/0", "solution": "#### 1"}\n')
    latin1 = tmp / "latin1.jsonl"
    latin1.write_bytes(b'{"task_id": "gsm8k/0", "solution": "#### 1"}\n{"task_id": "gsm8k/1", "solution": "caf\xe9"}\n')
    no_text = tmp / "no-text.jsonl"
    no_text.write_text('{"task_id": "gsm8k/0", "answer": "1"}\n')
    (tmp / "a-directory.jsonl").mkdir()
    (tmp / "a-file").write_text("")
    broken = fake_checkpoint(tmp / "broken-ckpt")
    (broken / "config.yaml").write_text("sample: [unclosed\n")
    used = tmp / "used"
    used.mkdir()
    (used / "summary.json").write_text("{}")
    busy = tmp / "busy"
    pid = hold(busy)
    return {
        "unknown task": (["--task", "nonsense", "--predictions", str(good)], "unknown task 'nonsense'"),
        "missing predictions": ([*task, "--predictions", str(tmp / "absent.jsonl")], str(tmp / "absent.jsonl")),
        "predictions is a folder": ([*task, "--predictions", str(tmp / "a-directory.jsonl")],
                                    str(tmp / "a-directory.jsonl")),
        "not UTF-8": ([*task, "--predictions", str(latin1)], f"{latin1}:2: not UTF-8"),
        "no text field": ([*task, "--predictions", str(no_text)], f"{no_text}:1: has neither 'completion'"),
        "missing checkpoint": ([*task, "--checkpoint", str(tmp / "no-ckpt")], f"no checkpoint at {tmp / 'no-ckpt'}"),
        "broken checkpoint config": ([*task, "--checkpoint", str(broken)], str(broken / "config.yaml")),
        "bad sampler setting": ([*task, "--checkpoint", str(broken), "--rho", "0"], "sample.rho"),
        "out cannot be made": ([*task, "--predictions", str(good), "--out", str(tmp / "a-file" / "out")],
                               str(tmp / "a-file" / "out")),
        "used out": ([*task, "--predictions", str(good), "--out", str(used)], f"output folder {used} holds results"),
        "out in use": ([*task, "--predictions", str(good), "--out", str(busy)], f"{busy} is in use by another "
                       f"elfreg process (pid {pid})"),
        "data unavailable": (["--task", "gsm8k", "--source", str(tmp / "gone.jsonl"), "--predictions", str(good)],
                             str(tmp / "gone.jsonl")),
        "corrupt data": (["--task", "gsm8k", "--source", str(latin1), "--predictions", str(good)],
                         f"{latin1}:2: not UTF-8"),
    }


def test_every_expected_failure_is_one_line_naming_the_culprit(tmp_path: Path, held_folder,
                                                               capsys: pytest.CaptureFixture) -> None:
    cases = _cases(tmp_path, held_folder)
    for name, (argv, needle) in cases.items():
        rc = main(["eval", *argv, "--no-progress"])
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert rc != 0, name
        assert len(lines) == 1 and "Traceback" not in captured.err, (name, captured.err)
        assert needle in lines[0], (name, lines[0])
        assert lines[0].startswith(("elfreg eval: error: ", "config error: ")), (name, lines[0])
    assert not (tmp_path / "busy" / "eval_config.json").exists()
    assert json.loads((tmp_path / "used" / "summary.json").read_text()) == {}
