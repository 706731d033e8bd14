"""HumanEval and HumanEval+ scored in the sandbox on the real problems: the first 40 (the slices
of tests/fixtures) and, in the slow suite where it is at hand, all of HumanEval+."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elfreg.eval import get_task
from elfreg.eval.code.expected import ExpectedOutputs

WORKERS = max(2, os.cpu_count() or 1)
CI_PLUS_LIMIT = 20  # plus inputs per problem in the fast suite (all of them in the slow test)
FIRST = [f"HumanEval/{i}" for i in range(40)]  # the slices' problems


def _humaneval():
    return get_task("humaneval", source="local")


def _humaneval_plus(tmp_path: Path, plus_limit: int | None):
    return get_task("humaneval+", source="local", plus_limit=plus_limit, expected=ExpectedOutputs(tmp_path))


def _with_body(prompt: str, body: str) -> str:
    return prompt + body


def test_canonical_pass_and_broken_bodies_fail() -> None:
    task = _humaneval()
    problems = task.problems()
    assert [p["task_id"] for p in problems] == FIRST
    n = len(problems)
    samples = [(p, p["canonical_solution"], "completion") for p in problems]
    samples += [(p, p["prompt"] + p["canonical_solution"], "solution") for p in problems]
    samples += [(p, "    pass\n", "completion") for p in problems]
    samples += [(p, _with_body(p["prompt"], "    return '__wrong__'\n"), "solution") for p in problems]
    verdicts = task.check_many(samples, workers=WORKERS)
    blocks = [verdicts[i * n : (i + 1) * n] for i in range(4)]
    assert [sum(v.passed for v in b) for b in blocks] == [n, n, 0, 0]
    for v in blocks[2] + blocks[3]:
        assert v.reason and v.scores == {"base": False, "base_noalias": False}
    assert all(v.scores == {"base": True, "base_noalias": True} for v in blocks[0])


def test_alias_scored_both_ways_and_markdown_output() -> None:
    task = _humaneval()
    p = task.problem("HumanEval/0")
    renamed = p["prompt"].replace("def has_close_elements", "def my_function") + p["canonical_solution"]
    markdown = "Here is my answer:\n```python\n" + p["prompt"] + p["canonical_solution"] + "```\nDone."
    garbage = "I cannot solve this."
    exits = p["prompt"] + "    import os\n    os._exit(0)\n"
    v_alias, v_md, v_bad, v_exit = task.check_many(
        [(p, renamed, "solution"), (p, markdown, "solution"), (p, garbage, "solution"), (p, exits, "solution")],
        workers=WORKERS,
    )
    assert v_alias.passed and v_alias.scores == {"base": True, "base_noalias": False}
    assert v_alias.details["aliased_from"] == "my_function"
    assert v_md.passed and v_md.scores["base_noalias"]
    assert not v_bad.passed and "not defined" in v_bad.reason
    assert not v_exit.passed and "exited before its tests finished" in v_exit.reason
    no_alias = get_task("humaneval", source="local").check_many([(p, renamed, "solution")], workers=1, alias=False)
    assert not no_alias[0].passed and "alias" in no_alias[0].reason


def test_helpers_of_the_prompt_are_available() -> None:
    task = _humaneval()
    # HumanEval/38: the test calls encode_cyclic, which a solution need not repeat
    p = task.problem("HumanEval/38")
    solution = "def decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n"
    assert task.check(p, solution).passed


def test_humaneval_plus_canonical_pass_extended_tests_subset(tmp_path: Path) -> None:
    task = _humaneval_plus(tmp_path, CI_PLUS_LIMIT)
    problems = task.problems()
    assert [p["task_id"] for p in problems] == FIRST
    n = len(problems)
    samples = [(p, p["prompt"] + p["canonical_solution"], "solution") for p in problems]
    # a program that is right on the original tests but wrong beyond them
    p0 = task.problem("HumanEval/0")
    tricky = p0["prompt"] + (
        "    if len(numbers) > 6:\n        return False\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    )
    samples.append((p0, tricky, "solution"))
    samples.append((p0, p0["prompt"] + "    pass\n", "solution"))
    verdicts = task.check_many(samples, workers=WORKERS)
    canonical = verdicts[:n]
    assert sum(v.scores["base"] for v in canonical) == n
    assert sum(v.scores["plus"] for v in canonical) == n
    assert all(v.passed for v in canonical)
    tricky_v, pass_v = verdicts[n:]
    assert tricky_v.scores["base"] and not tricky_v.scores["plus"] and "input #" in tricky_v.reason
    assert not pass_v.scores["base"] and not pass_v.scores["plus"]


@pytest.mark.slow
@pytest.mark.full_data("evalplus/HumanEvalPlus-v0.1.10.jsonl")
def test_humaneval_plus_canonical_pass_all_extended_tests(tmp_path: Path) -> None:
    task = _humaneval_plus(tmp_path, None)
    problems = task.problems()
    assert len(problems) == 164 and sum(p["code"].io.n_total for p in problems) == 1570 + 122683
    verdicts = task.check_many([(p, p["prompt"] + p["canonical_solution"], "solution") for p in problems],
                               workers=WORKERS)
    failed = [(p["task_id"], v.reason) for p, v in zip(problems, verdicts, strict=True) if not v.passed]
    assert failed == []
