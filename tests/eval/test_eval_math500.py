"""MATH-500: answer extraction and math-verify checking on the first problems (the slice of
tests/fixtures) and, where it is at hand, on the whole set."""

from __future__ import annotations

import pytest

from elfreg.eval import extract_math_answer, get_task, math_equal
from elfreg.eval.tasks.math500 import last_boxed


def _problems() -> list[dict]:
    return get_task("math500", source="local").problems()


def _gold_failures(problems: list[dict]) -> tuple[list, list]:
    """(gold answers math-verify cannot parse, gold answers that fail their own boxed solution)."""
    task = get_task("math500", source="local")
    unparsable = []
    failures = []
    for p in problems:
        boxed = last_boxed(p["solution"])
        assert boxed is not None, p["task_id"]
        verdict = task.check(p, p["solution"])
        if "cannot parse" in verdict.reason:
            unparsable.append((p["task_id"], verdict.reason))
        elif not verdict.passed:
            failures.append((p["task_id"], p["answer"], boxed, verdict.reason))
    return unparsable, failures


def test_the_first_gold_answers_verify_against_their_own_boxed_solutions() -> None:
    problems = _problems()
    assert [p["task_id"] for p in problems] == [f"math500/{i}" for i in range(48)]
    assert _gold_failures(problems) == ([], [])


@pytest.mark.full_data("math500/test.jsonl")
def test_every_gold_answer_verifies_against_its_own_boxed_solution() -> None:
    problems = _problems()
    assert len(problems) == 500
    # math-verify 0.9.0 parses every gold answer and every boxed answer of MATH-500
    assert _gold_failures(problems) == ([], [])


def test_wrong_answers_fail() -> None:
    problems = _problems()
    task = get_task("math500", source="local")
    # pair each problem with the next problem's answer; where the answers differ numerically and
    # symbolically (checked with plain numbers), the verdict must be False
    checked = 0
    for p, q in zip(problems, problems[1:], strict=False):
        a, b = p["answer"].strip(), q["answer"].strip()
        if a.isdigit() and b.isdigit() and int(a) != int(b):
            verdict = task.check(p, f"so the result is \\boxed{{{b}}}")
            assert not verdict.passed, (p["task_id"], a, b)
            checked += 1
    assert checked >= 10  # 13 such pairs in the slice: the check is not vacuous


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("\\boxed{3} then \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("The final answer is $42$.", "42"),
        ("Therefore the answer is: 7", "7"),
        ("\\fbox{5}", "5"),
        ("nothing to see", None),
    ],
)
def test_extraction(text: str, want: str | None) -> None:
    assert extract_math_answer(text) == want


def test_math_equal_is_symbolic() -> None:
    assert math_equal("0.5", "\\frac{1}{2}")
    assert math_equal("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}")
    assert math_equal("(3, -1)", "(3,-1)")
    assert not math_equal("2", "3")


def test_prompt_asks_for_boxed_answer() -> None:
    task = get_task("math500", source="local")
    p = _problems()[0]
    prompt = task.prompt(p)
    assert "\\boxed{}" in prompt and p["problem"] in prompt


def test_the_reference_is_parsed_without_a_wall_clock_limit(monkeypatch) -> None:
    """math-verify's limits are wall-clock (signal.alarm): on a busy CPU the benchmark's own answer
    could time out and read as unparsable, so only the model's output is parsed under one."""
    import math_verify

    calls = []
    real = math_verify.parse

    def recording(text, *args, **kwargs):
        calls.append((text, kwargs.get("parsing_timeout", "default")))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(math_verify, "parse", recording)
    task = get_task("math500", source="local")
    problem = _problems()[0]
    assert task.check(problem, f"so \\boxed{{{problem['answer']}}}").passed
    assert calls == [(f"${problem['answer']}$", None), (f"${problem['answer']}$", "default")]
