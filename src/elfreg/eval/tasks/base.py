"""The benchmark task interface: problems, zero-shot prompt, checking.

Contract of a :class:`Task`: :meth:`~Task.problems` loads the benchmark once (local copy, file
or Hub, see :mod:`elfreg.eval.tasks.sources`) and returns its problems in benchmark order, each with a
unique ``task_id``; :meth:`~Task.prompt` fills the task's ``str.format`` template from a problem;
:meth:`~Task.check` turns one model output into a :class:`~elfreg.eval.verdict.Verdict` and
:meth:`~Task.check_many` does so for many samples (code tasks run them in parallel sandboxes),
returning the verdicts in input order. Subclasses set the class attributes and implement
``_build`` (rows → problems) and ``check``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from elfreg.paths import data_dir

from ...text.templates import TEMPLATES, render_prompt
from ..verdict import Verdict
from .sources import DataSource, load_rows

__all__ = ["Task", "Sample"]

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
    template_name: ClassVar[str]
    """The task's template in :data:`elfreg.text.templates.TEMPLATES` (training uses the same)."""
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
        self.template_given = template is not None
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
        """The template's fields of ``problem``; ``prompt`` (the ``raw`` template's field) is the
        main field when the task has no field of that name."""
        values = {k: problem[k] for k in self.template_fields}
        values.setdefault("prompt", values[self.template_fields[0]])
        return values

    def use_trained_template(self, trained: str) -> None:
        """Prompt as a checkpoint trained with template ``trained`` saw its prompts: ``raw``
        switches to the main field alone; a task template is already this task's own. A template
        given to the constructor always wins."""
        if trained == "raw" and not self.template_given:
            self.template = TEMPLATES["raw"].prompt

    def prompt(self, problem: dict[str, Any]) -> str:
        """The zero-shot prompt for ``problem``: :func:`elfreg.text.templates.render_prompt`, the
        function that also builds the prompts of training examples."""
        return render_prompt(self.template, self.template_values(problem))

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
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Verdict]:
        """Check many ``(problem, output, form)`` samples (code tasks run them in parallel).

        Once ``should_stop()`` is true no further sample is checked: the rest come back as
        :meth:`Verdict.not_scored`.
        """
        verdicts = []
        for problem, output, form in samples:
            if should_stop is not None and should_stop():
                verdicts.append(Verdict.not_scored())
                continue
            verdicts.append(self.check(problem, output, form))
            if progress is not None:
                progress(1)
        return verdicts

    def primary_score(self, alias: bool = True) -> str | None:
        """Name of the headline score among :attr:`score_names` (``None`` for text tasks)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"task": self.name, "kind": self.kind, "template": self.template, "data": self.provenance}

    def identity(self) -> dict[str, Any]:
        """What selects the problems and prompts, known before the data is loaded: the task, the
        data source and folder, the template (part of an output folder's identity)."""
        return {"task": self.name, "source": self.source, "data_dir": str(data_dir(self.data_dir)),
                "template": self.template}
