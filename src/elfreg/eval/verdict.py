"""The result of checking one model output against one problem."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Verdict"]


@dataclasses.dataclass
class Verdict:
    """Outcome of checking one output.

    Attributes:
        passed: the task's headline verdict.
        extracted: what was taken from the output (the number, the answer, the option letter or
            the sanitised program); ``None`` when nothing usable was found.
        reason: why it failed ("" when it passed).
        scores: named verdicts when a task reports several scorings of the same output, e.g.
            ``{"base": True, "plus": False, "base_noalias": True, "plus_noalias": False}`` for
            HumanEval+; ``{}`` for single-score tasks.
        details: extra per-sample information (e.g. which function was aliased, sandbox status).
        scored: ``False`` for a sample that was never checked because the evaluation was
            stopped first (see :meth:`not_scored`); scoring leaves such samples out.
    """

    passed: bool
    extracted: str | None
    reason: str = ""
    scores: dict[str, bool] = dataclasses.field(default_factory=dict)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    scored: bool = True

    @classmethod
    def not_scored(cls) -> Verdict:
        """The verdict of a sample left unchecked because the evaluation was stopped."""
        return cls(False, None, "not scored: the evaluation was stopped", scored=False)
