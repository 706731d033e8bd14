"""The evaluator's side of the in-sandbox test harness (``_harness.py``).

Contract: a :class:`CodeProblem` says what a code problem's tests are (an assert suite and/or
EvalPlus-style differential inputs, :class:`IOTests`); :func:`harness_job` makes the sandbox job
that runs harness suites on one program (the suites travel as a ``marshal``-ed ``spec.bin``,
results come back as one JSON line per suite on the result channel); :func:`suite_results`
reads those lines back and :func:`sandbox_reason` explains a run that left no result.
:data:`HARNESS_VERSION` changes whenever the harness's results could change (it keys the cache
of expected outputs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import marshal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .sandbox import SandboxJob, SandboxLimits, SandboxResult

__all__ = ["HARNESS_VERSION", "CODE_LIMITS", "IOTests", "CodeProblem", "harness_job", "suite_results",
           "sandbox_reason"]

HARNESS_VERSION = "5"
_HARNESS_SOURCE = Path(__file__).with_name("_harness.py").read_text(encoding="utf-8")
#: limits of a tested program (4 GiB address space, as EvalPlus allows)
CODE_LIMITS = SandboxLimits(memory_mb=4096)
_PROGRAM_FILE = "candidate.py"


@dataclasses.dataclass(frozen=True)
class IOTests:
    """Differential tests of one problem: JSON inputs, base inputs first."""

    inputs_json: str  #: JSON list of argument lists (base then plus)
    n_base: int  #: how many of them are base inputs
    n_total: int
    atol: float
    convert: str = ""  #: input type-restoration rule (``mbpp:<n>``), applied in the sandbox

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.convert}|{self.atol}|{self.inputs_json}".encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class CodeProblem:
    """What the code checker needs to know about one problem."""

    task_id: str
    prompt: str  #: the benchmark's code prompt (``completion`` outputs are appended to it)
    entry_point: str
    context: str  #: code placed before every program (prompt imports and helpers)
    canonical: str  #: the reference program (used for expected outputs and self-tests)
    assert_test: str | None  #: test code of the assert suite (``None``: no assert suite)
    test_names: frozenset[str] = frozenset()  #: names the tests reference (kept by sanitising)
    io: IOTests | None = None  #: differential tests (``None``: none)


def harness_job(
    program: str,
    suites: Sequence[Mapping[str, Any]],
    wall: float,
    *,
    files: Mapping[str, str | bytes] | None = None,
    limits: SandboxLimits = CODE_LIMITS,
) -> SandboxJob:
    """A sandbox job running the harness ``suites`` (in order) on ``program``.

    ``files`` are the suites' data files (inputs, expected outputs); ``wall`` is the run's
    wall-clock limit, which should exceed the suites' own budgets.
    """
    spec = {"program_file": _PROGRAM_FILE, "suites": [dict(s) for s in suites]}
    payload: dict[str, str | bytes] = {_PROGRAM_FILE: program, **dict(files or {})}
    payload["spec.bin"] = marshal.dumps(spec)
    return SandboxJob(_HARNESS_SOURCE, wall, payload, (), limits, channel=True)


def suite_results(res: SandboxResult) -> dict[str, dict[str, Any]]:
    """``suite name → result record`` of the suites the harness finished (malformed lines skipped)."""
    results: dict[str, dict[str, Any]] = {}
    for line in res.channel.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "suite" in record:
            results[str(record["suite"])] = record
    return results


def sandbox_reason(res: SandboxResult) -> str:
    """Why a run has no result for a suite (the program ended the harness, or the sandbox did)."""
    if res.status == "ok":
        return "the program exited before its tests finished"
    if res.status == "error":
        return f"the program exited before its tests finished ({res.reason})"
    return f"{res.status}: {res.reason}"
