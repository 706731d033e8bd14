"""MBPP (original, 974 / MBPP-500) and MBPP+ (MBPP-378) scored in the sandbox: on the slices of
tests/fixtures and, where they are at hand, on the whole sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elfreg.eval import get_task
from elfreg.eval.code.expected import ExpectedOutputs

WORKERS = max(2, os.cpu_count() or 1)
CI_PLUS_LIMIT = 3
# MBPP+ problems whose inputs are given types in the sandbox (tuples, sets, complex numbers) or
# that use a special oracle; they are always part of the fast subset.
SPECIAL = {"Mbpp/2", "Mbpp/63", "Mbpp/75", "Mbpp/106", "Mbpp/115", "Mbpp/124", "Mbpp/252", "Mbpp/259",
           "Mbpp/278", "Mbpp/307", "Mbpp/558", "Mbpp/580", "Mbpp/581", "Mbpp/722", "Mbpp/737", "Mbpp/787",
           "Mbpp/794", "Mbpp/793"}
# the slice: the prompt split (1-10), test ids 11-40 and 367, validation ids 511-514
SLICE_IDS = [*range(1, 41), 367, *range(511, 515)]


def _failed_canonical(task, problems: list[dict]) -> list[tuple[str, str]]:
    samples = [(p, p["canonical_solution"], "solution") for p in problems]
    verdicts = task.check_many(samples, workers=WORKERS, timeout=30)
    return [(p["task_id"], v.reason) for p, v in zip(problems, verdicts, strict=True) if not v.passed]


def test_reference_solutions_pass_their_base_tests() -> None:
    task = get_task("mbpp", source="local", subset="all")
    problems = task.problems()
    assert [p["task_id"] for p in problems] == [f"Mbpp/{i}" for i in SLICE_IDS]
    assert _failed_canonical(task, problems) == []
    # the default task is MBPP-500: ids 11-510 only
    assert [p["task_id"] for p in get_task("mbpp", source="local").problems()] == [
        f"Mbpp/{i}" for i in SLICE_IDS if 11 <= i <= 510]


@pytest.mark.full_data("mbpp/mbpp.jsonl", "evalplus/MbppPlus-v0.2.0.jsonl")
def test_reference_solutions_pass_their_base_tests_all_974() -> None:
    task = get_task("mbpp", source="local", subset="all")
    problems = task.problems()
    plus_ids = {p["task_id"] for p in get_task("mbpp+", source="local").problems()}
    assert len(problems) == 974 and _failed_canonical(task, problems) == []
    ids = [p["task_id"] for p in problems]
    assert sum(11 <= int(tid.split("/")[1]) <= 510 for tid in ids) == 500
    assert len(plus_ids) == 378 and plus_ids <= set(ids)
    # the default task is MBPP-500
    assert [p["task_id"] for p in get_task("mbpp", source="local").problems()] == [f"Mbpp/{i}" for i in range(11, 511)]


def test_wrong_programs_fail_and_test_setup_classes_are_kept() -> None:
    task = get_task("mbpp", source="local", subset="all")
    p = task.problem("Mbpp/11")
    wrong = f"def {p['entry_point']}(s, ch):\n    return s\n"
    p367 = task.problem("Mbpp/367")  # its test setup builds trees with the program's Node class
    chatty = "Sure!\n```python\n" + p367["canonical_solution"] + "\n\nprint('demo')\n```\n"
    v_wrong, v_367 = task.check_many([(p, wrong, "solution"), (p367, chatty, "solution")], workers=WORKERS)
    assert not v_wrong.passed and "AssertionError" in v_wrong.reason
    assert v_367.passed and "class Node" in v_367.extracted


def _plus_task(tmp_path: Path, plus_limit: int | None):
    return get_task("mbpp+", source="local", plus_limit=plus_limit, expected=ExpectedOutputs(tmp_path))


def test_mbpp_plus_canonical_solutions_pass_subset(tmp_path: Path) -> None:
    task = _plus_task(tmp_path, CI_PLUS_LIMIT)
    problems = task.problems()
    # the slice: MBPP+'s first 15 problems and every special one (MBPP+ v0.2.0 has no 115 or 307)
    assert len(problems) == 30 and SPECIAL - {p["task_id"] for p in problems} == {"Mbpp/115", "Mbpp/307"}
    samples = [(p, p["prompt"] + p["canonical_solution"], "solution") for p in problems]
    p2 = task.problem("Mbpp/2")
    samples.append((p2, "def similar_elements(a, b):\n    return list(set(a) & set(b))\n", "solution"))
    samples.append((p2, "def similar_elements(a, b):\n    return a + b\n", "solution"))
    verdicts = task.check_many(samples, workers=WORKERS)
    failed = [(s[0]["task_id"], v.reason) for s, v in zip(samples[:-2], verdicts, strict=False) if not v.passed]
    assert failed == []
    assert all(v.scores["base"] and v.scores["plus"] for v in verdicts[:-2])
    # set-equality oracle: the order (and list-vs-tuple) of the shared elements does not matter
    assert verdicts[-2].scores == {"base": True, "base_noalias": True, "plus": True, "plus_noalias": True}
    assert not verdicts[-1].scores["base"]


@pytest.mark.slow
@pytest.mark.full_data("evalplus/MbppPlus-v0.2.0.jsonl")
def test_mbpp_plus_canonical_solutions_pass_all(tmp_path: Path) -> None:
    task = _plus_task(tmp_path, None)
    problems = task.problems()
    assert len(problems) == 378
    verdicts = task.check_many([(p, p["prompt"] + p["canonical_solution"], "solution") for p in problems],
                               workers=WORKERS)
    failed = [(p["task_id"], v.reason) for p, v in zip(problems, verdicts, strict=True) if not v.passed]
    assert failed == []
