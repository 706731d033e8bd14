"""GSM8K answer extraction, numeric comparison, and the task on the test set's first rows (the
slice of tests/fixtures) and, where it is at hand, on the whole test set."""

from __future__ import annotations

import pytest

from elfreg.eval import extract_gsm8k_answer, get_task, numbers_equal, parse_number
from elfreg.eval.tasks.gsm8k import gsm8k_gold_answer

# (output, extracted answer): the documented rules, one row per tricky format.
TRICKY = [
    ("She has 1,234 apples.\n#### 1,234", "1234"),
    ("#### -5", "-5"),
    ("The answer is $1,234.50.", "1234.50"),
    ("The answer is −7.", "-7"),  # Unicode minus
    ("So 10-3=7 apples.", "7"),  # subtraction is not a negative sign
    ("Total: \\boxed{1,000}", "1000"),
    ("#### $ 70", "70"),
    ("#### 10%", "10"),
    ("The answer is 3/4.", "3/4"),
    ("Final answer: -3.5", "-3.5"),
    ("#### 5.00", "5.00"),
    ("It costs .5 dollars", "0.5"),
    ("x 1,000,000 y", "1000000"),
    ("#### The answer is 18", "18"),
    ("The answer is 12 apples and 3 pears", "12"),  # first number after the phrase
    ("a 5 b 6.", "6"),  # no marker: last number, trailing period dropped
    ("First 3 then #### 4 and #### 9", "9"),  # last ####
    ("The answer is 4. Wait, the answer is 5.", "5"),  # last phrase
    ("Compute 2 + 2 = <<2+2=4>>4", "4"),
    ("no numbers here", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "want"), TRICKY)
def test_tricky_formats(text: str, want: str | None) -> None:
    assert extract_gsm8k_answer(text) == want


def test_numbers_equal() -> None:
    assert numbers_equal("1234.50", "1234.5")
    assert numbers_equal("0.75", "3/4")
    assert numbers_equal("1,234", "1234")
    assert not numbers_equal("-5", "5")
    assert not numbers_equal(None, "5")
    assert not numbers_equal("5.01", "5")
    assert parse_number("$1,234.50.") == parse_number("1234.5")


def _disagreements(problems: list[dict]) -> list[str]:
    """Problems whose gold rationale does not extract to its gold answer, numerically or as the
    same string (commas removed, negatives kept)."""
    return [p["task_id"] for p in problems
            if not numbers_equal(extract_gsm8k_answer(p["solution"]), p["answer"])
            or extract_gsm8k_answer(p["solution"]) != p["answer"]]


def test_the_gold_rationales_of_the_first_rows_extract_to_their_gold_answers() -> None:
    problems = get_task("gsm8k", source="local").problems()
    assert [p["task_id"] for p in problems] == [f"gsm8k/{i}" for i in range(40)]
    assert _disagreements(problems) == []


@pytest.mark.full_data("gsm8k/test.jsonl")
def test_all_gold_rationales_extract_to_gold_answers() -> None:
    problems = get_task("gsm8k", source="local").problems()
    assert len(problems) == 1319 and _disagreements(problems) == []
    assert sum(p["answer"].startswith("-") for p in problems) == 2


def test_task_check_and_prompt() -> None:
    task = get_task("gsm8k", source="local")
    problem = task.problems()[0]
    assert problem["task_id"] == "gsm8k/0"
    assert problem["question"] in task.prompt(problem)
    good = task.check(problem, "Some reasoning.\n#### 18")
    assert good.passed and good.extracted == "18"
    bad = task.check(problem, "The answer is 17.")
    assert not bad.passed and bad.extracted == "17" and "18" in bad.reason
    none = task.check(problem, "I do not know")
    assert not none.passed and none.extracted is None


def test_gold_answer_helper() -> None:
    assert gsm8k_gold_answer("blah\n#### 1,080") == "1080"
