"""Where tasks get their rows: local copies, explicit files and the Hub (faked here)."""

from __future__ import annotations

import gzip
import json
import sys
import types
from pathlib import Path

import pytest

from elfreg.eval import DataUnavailable, check_program, get_task


class _FakeDatasets(types.ModuleType):
    def __init__(self, rows: list[dict]) -> None:
        super().__init__("datasets")
        self.rows = rows
        self.calls: list[tuple] = []

    def load_dataset(self, name, config=None, split=None):  # noqa: D401 - mimics datasets.load_dataset
        self.calls.append((name, config, split))
        return list(self.rows)


def test_hub_is_used_when_no_local_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeDatasets([{"question": "1+1?", "answer": "1+1=2\n#### 2"}])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    task = get_task("gsm8k", data_dir=tmp_path)  # empty data dir → Hub
    problems = task.problems()
    assert fake.calls == [("openai/gsm8k", "main", "test")]
    assert problems == [{"task_id": "gsm8k/0", "question": "1+1?", "solution": "1+1=2\n#### 2", "answer": "2"}]
    assert task.provenance["origin"] == "hub"
    mmlu = _FakeDatasets([{"question": "q", "subject": "virology", "choices": ["a", "b", "c", "d"], "answer": 2}])
    monkeypatch.setitem(sys.modules, "datasets", mmlu)
    task = get_task("mmlu", source="hub")
    assert task.problems()[0]["answer"] == "C" and mmlu.calls == [("cais/mmlu", "all", "test")]


def test_missing_local_data_and_no_datasets_package_is_a_clear_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataUnavailable, match="pip install datasets"):
        get_task("math500", data_dir=tmp_path).problems()
    with pytest.raises(DataUnavailable, match="local data not found"):
        get_task("math500", data_dir=tmp_path, source="local").problems()


def test_explicit_file_overrides_and_plus_rows_need_extended_inputs(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"problem": "1+1", "solution": "\\boxed{2}", "answer": "2"}) + "\n")
    task = get_task("math500", source=str(path))
    assert len(task.problems()) == 1 and task.provenance["path"] == str(path)
    assert task.check(task.problems()[0], "it is $\\boxed{2}$").passed
    he = tmp_path / "he.jsonl"
    he.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f",
                              "canonical_solution": "    return 1\n", "test": "def check(c):\n    pass\n"}) + "\n")
    with pytest.raises(DataUnavailable, match="base_input"):
        get_task("humaneval+", source=str(he)).problems()


def test_data_files_are_read_with_the_one_jsonl_reader(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(2)]
    packed = tmp_path / "gsm8k.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    assert [p["answer"] for p in get_task("gsm8k", source=str(packed)).problems()] == ["0", "1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n[1, 2]\n")
    with pytest.raises(DataUnavailable, match=f"{bad}:2: expected a JSON object, got list"):
        get_task("gsm8k", source=str(bad)).problems()


def test_custom_templates() -> None:
    task = get_task("gsm8k", template="Q: {question}\nA:")
    assert task.prompt({"question": "why?"}) == "Q: why?\nA:"


def test_check_program_for_small_function_tasks() -> None:
    tests = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"
    good = check_program("```python\ndef add(a, b):\n    return a + b\n```", tests, "add")
    assert good.passed and good.scores == {"base": True, "base_noalias": True}
    renamed = check_program("def plus(a, b):\n    return a + b\n", tests, "add")
    assert renamed.passed and not renamed.scores["base_noalias"]
    assert not check_program("def plus(a, b):\n    return a + b\n", tests, "add", alias=False).passed
    wrong = check_program("def add(a, b):\n    return a - b\n", tests, "add")
    assert not wrong.passed and wrong.reason == "AssertionError at test line 1: assert add(1, 2) == 3"
    slow = check_program("def add(a, b):\n    while True:\n        pass\n", tests, "add", timeout=1)
    assert not slow.passed and "time limit" in slow.reason
