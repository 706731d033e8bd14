"""Task names and aliases, and :func:`get_task`.

Contract: :data:`TASKS` maps each canonical name to its class, in the order the CLI lists them;
names and aliases are matched case-insensitively; an unknown name is a ``ValueError`` that
lists the known ones.
"""

from __future__ import annotations

from typing import Any

from .base import Task
from .code import HumanEvalPlusTask, HumanEvalTask, MbppPlusTask, MbppTask
from .elf import OwtGenPplTask, Wmt14DeEnTask, XsumTask
from .text import Gsm8kTask, Math500Task, MmluTask

__all__ = ["TASKS", "get_task", "task_names", "canonical_task_name"]

TASKS: dict[str, type[Task]] = {
    "gsm8k": Gsm8kTask,
    "math500": Math500Task,
    "mmlu": MmluTask,
    "humaneval": HumanEvalTask,
    "humaneval+": HumanEvalPlusTask,
    "mbpp": MbppTask,
    "mbpp+": MbppPlusTask,
    "xsum": XsumTask,
    "wmt14-de-en": Wmt14DeEnTask,
    "owt-genppl": OwtGenPplTask,
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
    "wmt14": "wmt14-de-en",
    "de-en": "wmt14-de-en",
    "owt": "owt-genppl",
    "gen-ppl": "owt-genppl",
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
    (``test``/``all``) for ``mbpp``; ``n``, ``ppl_model``, ``ppl_batch_size``, ``ppl_max_length`` and
    ``device`` for ``owt-genppl``.
    """
    return TASKS[canonical_task_name(name)](**options)
