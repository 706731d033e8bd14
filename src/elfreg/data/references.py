"""The test items training data is decontaminated against, read by the benchmark loaders of
``eval/`` (local copies under :func:`elfreg.paths.data_dir`, or the packages that ship them).

=========  =========================================================================
name       test items (text compared; reference programs for the AST rule)
=========  =========================================================================
gsm8k      the 1,319 GSM8K test questions
math500    the 500 MATH-500 problems
mmlu       the 14,042 MMLU test questions
humaneval  the 164 HumanEval tasks: the docstring of the function to write; programs:
           prompt + canonical solution, and HumanEval+'s corrected solution
mbpp       all 974 MBPP tasks (MBPP+ draws on train and validation ids too): the task
           text; programs: MBPP's code and MBPP+'s canonical solution
=========  =========================================================================
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from ..eval.code.sanitize import parse_quietly
from ..eval.tasks import HumanEvalPlusTask, MbppPlusTask, get_task
from ..eval.tasks.sources import DataSource, load_rows

__all__ = ["BenchmarkItem", "load_references"]


@dataclass(frozen=True)
class BenchmarkItem:
    """One test item: its benchmark, id, question text and reference programs."""

    benchmark: str
    id: str
    text: str
    solutions: tuple[str, ...] = ()


def _docstring(prompt: str, entry_point: str) -> str:
    try:
        tree = parse_quietly(prompt)
    except SyntaxError:
        return prompt
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            return ast.get_docstring(node) or prompt
    return prompt


def _plus_solutions(src: DataSource, data_dir: str | os.PathLike | None, with_prompt: bool) -> dict[str, str]:
    try:
        rows, _ = load_rows(src, "local", data_dir)
    except RuntimeError:  # no local EvalPlus copy: the original solutions alone
        return {}
    return {r["task_id"]: (r["prompt"] if with_prompt else "") + r["canonical_solution"] for r in rows}


def _humaneval(data_dir: str | os.PathLike | None) -> list[BenchmarkItem]:
    plus = _plus_solutions(HumanEvalPlusTask.data, data_dir, with_prompt=True)
    return [BenchmarkItem("humaneval", p["task_id"], _docstring(p["prompt"], p["entry_point"]),
                     tuple(s for s in (p["prompt"] + p["canonical_solution"], plus.get(p["task_id"])) if s))
            for p in get_task("humaneval", data_dir=data_dir).problems()]


def _mbpp(data_dir: str | os.PathLike | None) -> list[BenchmarkItem]:
    plus = _plus_solutions(MbppPlusTask.data, data_dir, with_prompt=False)
    return [BenchmarkItem("mbpp", p["task_id"], p["text"],
                     tuple(s for s in (p["canonical_solution"], plus.get(p["task_id"])) if s))
            for p in get_task("mbpp", data_dir=data_dir, subset="all").problems()]


def _text_items(name: str, field: str, data_dir: str | os.PathLike | None) -> list[BenchmarkItem]:
    return [BenchmarkItem(name, p["task_id"], p[field]) for p in get_task(name, data_dir=data_dir).problems()]


def load_references(names: list[str], data_dir: str | os.PathLike | None = None) -> list[BenchmarkItem]:
    """The test items of the benchmarks ``names`` (see the module docstring)."""
    loaders = {"gsm8k": lambda d: _text_items("gsm8k", "question", d),
               "math500": lambda d: _text_items("math500", "problem", d),
               "mmlu": lambda d: _text_items("mmlu", "question", d),
               "humaneval": _humaneval, "mbpp": _mbpp}
    unknown = [n for n in names if n not in loaders]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)} (known: {', '.join(loaders)})")
    return [item for name in names for item in loaders[name](data_dir)]
