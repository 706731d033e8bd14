"""The expected-outputs cache: entries written whole, read back by a fresh store, and a corrupt
entry recorded again instead of failing the evaluation."""

from __future__ import annotations

import json
from pathlib import Path

from elfreg.eval.code.expected import ExpectedOutputs
from elfreg.eval.code.harness import CodeProblem, IOTests


def _problem() -> CodeProblem:
    inputs = [[1], [2], [5]]
    return CodeProblem(task_id="Toy/0", prompt="", entry_point="double", context="",
                       canonical="def double(x):\n    return 2 * x\n", assert_test=None,
                       io=IOTests(json.dumps(inputs), 2, 3, 0.0))


def test_recorded_outputs_are_cached_and_a_corrupt_entry_is_recorded_again(tmp_path: Path) -> None:
    problem = _problem()
    first = ExpectedOutputs(tmp_path).get([problem], workers=1)["Toy/0"]
    assert "error" not in first and len(first["times"]) == 3
    (entry,) = tmp_path.glob("*.json")
    assert entry.read_text().count("\n") == 1 and json.loads(entry.read_text())["expected"] == first["expected"]
    progress: list[int] = []
    again = ExpectedOutputs(tmp_path).get([problem], workers=1, progress=progress.append)["Toy/0"]
    assert again["expected"] == first["expected"] and progress == []  # read from the cache, nothing run
    entry.write_text('{"expected": "cut')  # a writer died mid-entry
    redone = ExpectedOutputs(tmp_path).get([problem], workers=1, progress=progress.append)["Toy/0"]
    assert redone["expected"] == first["expected"] and progress == [1]
    assert json.loads(entry.read_text())["expected"] == first["expected"]


def test_a_stop_before_recording_caches_nothing(tmp_path: Path) -> None:
    out = ExpectedOutputs(tmp_path).get([_problem()], workers=1, should_stop=lambda: True)
    assert out["Toy/0"]["error"].startswith("not run") and list(tmp_path.glob("*.json")) == []
