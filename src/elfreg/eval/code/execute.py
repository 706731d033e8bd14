"""Sandboxed test execution for code problems (HumanEval(+), MBPP(+)).

Each sample becomes one sandboxed run of the test harness (``_harness.py``) on the sanitised
program, with the task's test suites:

* ``assert`` suites run the benchmark's original tests (HumanEval ``check(candidate)``, MBPP
  ``assert`` lines with their setup code);
* the ``io`` suite runs EvalPlus-style differential tests: the entry point on ``base_input +
  plus_input`` against the outputs of the canonical solution, which are recorded once by running
  the canonical solution inside the sandbox and cached on disk (see
  :class:`~.expected.ExpectedOutputs`). Since base inputs come first and testing stops at
  the first failure, the base score (base inputs only) is read off the same run.

The program is the prompt's context (its imports and helper functions, e.g. HumanEval's
``poly``) followed by the sanitised model program. Identical programs of the same problem are
run once.

:func:`check_program` does the same for one output and a few assert lines (small custom tasks);
:func:`run_assert_tests` runs a program as written, without extraction or sanitising, against
assert lines (programs that are known to be code, e.g. those of the toy code task).
"""

from __future__ import annotations

import ast
import base64
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..verdict import Verdict
from .expected import ExpectedOutputs
from .harness import CodeProblem, harness_job, sandbox_reason, suite_results
from .sandbox import NOT_RUN, SandboxJob, SandboxResult, run_many
from .sanitize import SanitizedProgram, extract_code, parse_quietly, sanitize

__all__ = ["check_code_samples", "check_program", "run_assert_tests"]

MIN_TIME_LIMIT = 1.0  #: seconds every differential-test input gets at least (EvalPlus default)
TIME_LIMIT_FACTOR = 4.0  #: × the canonical solution's time on that input (EvalPlus default)
_SETUP_WALL_S = 5.0  #: wall-clock allowance of a tested program beyond its suites' budgets


@dataclasses.dataclass
class _Run:
    problem: CodeProblem
    program: str
    budget_assert: float
    budget_io: float


def _program_for(problem: CodeProblem, san: SanitizedProgram) -> str:
    if problem.context:
        return problem.context + "\n\n" + san.program
    return san.program


def _job(run: _Run, expected: dict[str, Any] | None) -> SandboxJob:
    p = run.problem
    suites: list[dict[str, Any]] = []
    files: dict[str, str | bytes] = {}
    wall = _SETUP_WALL_S
    if p.assert_test is not None:
        suites.append({"name": "assert", "kind": "assert", "test": p.assert_test, "budget": run.budget_assert})
        wall += run.budget_assert
    if p.io is not None and expected is not None and "expected" in expected:
        limits = [max(MIN_TIME_LIMIT, TIME_LIMIT_FACTOR * t) for t in expected["times"]]
        budget = min(run.budget_io, sum(limits))
        suites.append({"name": "io", "kind": "io", "task_id": p.task_id, "entry_point": p.entry_point,
                       "inputs_file": "inputs.json", "expected_file": "expected.pkl.gz", "convert": p.io.convert,
                       "atol": p.io.atol, "time_limits": limits, "budget": budget})
        files["inputs.json"] = p.io.inputs_json
        files["expected.pkl.gz"] = _decoded(expected)
        wall += budget + 2.0
    return harness_job(run.program, suites, wall, files=files)


def _decoded(expected: dict[str, Any]) -> bytes:
    raw = expected.get("_bytes")
    if raw is None:
        raw = expected["_bytes"] = base64.b64decode(expected["expected"])
    return raw


def check_code_samples(
    samples: Sequence[tuple[CodeProblem, str, str]],
    score_names: Sequence[str],
    *,
    primary: str,
    workers: int | None = None,
    timeout: float = 10.0,
    io_timeout: float = 60.0,
    expected: ExpectedOutputs | None = None,
    progress: Callable[[int], None] | None = None,
    record_progress: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[Verdict]:
    """Check many ``(problem, output, form)`` samples; ``form`` is ``solution`` or ``completion``.

    Args:
        score_names: the scorings to report, from ``base`` (assert suite, or base inputs of the io
            suite when the problem has no assert suite) and ``plus`` (all io inputs); each also
            gets a ``*_noalias`` twin that fails when the alias was needed.
        primary: the score that becomes :attr:`Verdict.passed` (e.g. ``plus`` or
            ``base_noalias``).
        timeout: time budget (s) of an assert suite, program loading included.
        io_timeout: cap (s) on the differential-test suite (each input also has its own limit:
            ``max(1 s, 4 × canonical time)``).
        expected: store of recorded outputs (a default on-disk cache when ``None``).
        should_stop: once true, no further sandbox is launched (recording included); samples
            whose program did not run come back as :meth:`Verdict.not_scored`.
    """
    expected = expected or ExpectedOutputs()
    io_problems = {s[0].task_id: s[0] for s in samples if s[0].io is not None}
    outputs = expected.get(list(io_problems.values()), workers, record_progress, should_stop) if io_problems else {}
    if should_stop is not None and should_stop():  # stopped while recording: the references are incomplete
        return [Verdict.not_scored() for _ in samples]

    prepared: list[tuple[SanitizedProgram, str | None]] = []
    runs: dict[tuple[str, str], _Run] = {}
    for problem, output, form in samples:
        text = (problem.prompt + output) if form == "completion" else output
        code = extract_code(text, problem.entry_point)
        san = sanitize(code, problem.entry_point, alias=True, extra_roots=problem.test_names)
        if not san.defined:
            prepared.append((san, None))
            continue
        program = _program_for(problem, san)
        key = (problem.task_id, program)
        if key not in runs:
            runs[key] = _Run(problem, program, timeout, io_timeout)
        prepared.append((san, program))

    run_keys = list(runs)
    jobs = [_job(runs[k], outputs.get(k[0])) for k in run_keys]
    results = dict(zip(run_keys, run_many(jobs, workers, progress=progress, should_stop=should_stop), strict=True))

    verdicts = []
    for (problem, _output, _form), (san, program) in zip(samples, prepared, strict=True):
        verdicts.append(_verdict(problem, san, program, results, outputs, score_names, primary))
    return verdicts


def _verdict(
    problem: CodeProblem,
    san: SanitizedProgram,
    program: str | None,
    results: dict[tuple[str, str], SandboxResult],
    outputs: dict[str, dict[str, Any]],
    score_names: Sequence[str],
    primary: str,
) -> Verdict:
    details: dict[str, Any] = {"aliased_from": san.aliased_from}
    if program is None:
        scores = {name: False for name in score_names}
        scores.update({f"{name}_noalias": False for name in score_names})
        return Verdict(False, None, san.reason, scores, details)
    res = results[(problem.task_id, program)]
    if res.status == NOT_RUN:
        return Verdict.not_scored()
    suites = suite_results(res)
    details["sandbox"] = res.status
    reasons: dict[str, str] = {}
    verdict_of: dict[str, bool] = {}

    assert_res = suites.get("assert")
    if problem.assert_test is not None:
        verdict_of["assert"] = bool(assert_res and assert_res.get("passed"))
        if not verdict_of["assert"]:
            reasons["assert"] = (assert_res or {}).get("reason") or sandbox_reason(res)

    if problem.io is not None:
        exp = outputs.get(problem.task_id, {})
        io_res = suites.get("io")
        if "error" in exp or not exp:
            verdict_of["plus"] = verdict_of["io_base"] = False
            reasons["plus"] = reasons["io_base"] = exp.get("error", "expected outputs unavailable")
        elif io_res is None:
            verdict_of["plus"] = verdict_of["io_base"] = False
            reasons["plus"] = reasons["io_base"] = sandbox_reason(res)
        else:
            verdict_of["plus"] = bool(io_res.get("passed"))
            failed_at = int(io_res.get("done", 0))
            has_input_index = str(io_res.get("reason", "")).startswith("input #")
            base_ok = verdict_of["plus"] or (has_input_index and failed_at >= problem.io.n_base)
            verdict_of["io_base"] = base_ok
            if not verdict_of["plus"]:
                reasons["plus"] = io_res.get("reason", "failed")
            if not base_ok:
                reasons["io_base"] = io_res.get("reason", "failed")

    base_key = "assert" if problem.assert_test is not None else "io_base"
    mapping = {"base": base_key, "plus": "plus"}
    scores: dict[str, bool] = {}
    for name in score_names:
        ok = verdict_of.get(mapping[name], False)
        scores[name] = ok
        scores[f"{name}_noalias"] = ok and san.aliased_from is None
    passed = scores.get(primary, False)
    reason = ""
    if not passed:
        source = mapping[primary.removesuffix("_noalias")]
        reason = reasons.get(source, "")
        if not reason and primary.endswith("_noalias") and san.aliased_from is not None:
            reason = f"entry point {problem.entry_point!r} missing (alias from {san.aliased_from!r} not allowed)"
    details["reasons"] = {mapping_name: reasons[src] for mapping_name, src in mapping.items()
                          if src in reasons and mapping_name in score_names}
    return Verdict(passed, san.program, reason, scores, details)


def check_program(
    output: str,
    tests: str,
    entry_point: str,
    *,
    alias: bool = True,
    timeout: float = 10.0,
    context: str = "",
) -> Verdict:
    """Check one model output against assert-style ``tests`` in the sandbox.

    A convenience for small custom function tasks: ``output`` is sanitised like any code
    sample (Markdown fences, prose and unrelated code removed; the alias option applied when
    ``alias``), ``context`` is placed before it, and ``tests`` (plain ``assert`` lines that call
    ``entry_point``) run after it. ``Verdict.scores`` has ``base`` and ``base_noalias``.
    """
    test_names = frozenset(n.id for n in ast.walk(parse_quietly(tests)) if isinstance(n, ast.Name))
    problem = CodeProblem(task_id="custom/0", prompt="", entry_point=entry_point, context=context,
                          canonical="", assert_test=tests, test_names=test_names)
    primary = "base" if alias else "base_noalias"
    return check_code_samples([(problem, output, "solution")], ("base",), primary=primary, workers=1,
                              timeout=timeout)[0]


def run_assert_tests(program: str, tests: str | Sequence[str], *, timeout: float = 10.0) -> Verdict:
    """Run ``program`` exactly as written, then assert-style ``tests``, in one sandboxed process.

    Unlike :func:`check_program`, nothing is extracted or sanitised: the verdict passes iff the
    program loads and no test line raises within ``timeout`` seconds (loading included); a
    program that ends the process early (``sys.exit``, ``os._exit``, a crash) fails. A failed
    verdict's ``reason`` names the error and the test line (``AssertionError at test line 1:
    assert f(2) == 3``), ``time limit exceeded``, or what the sandbox saw. ``details["sandbox"]``
    is the sandbox status.
    """
    test_code = tests if isinstance(tests, str) else "\n".join(tests)
    problem = CodeProblem(task_id="custom/0", prompt="", entry_point="", context="", canonical="",
                          assert_test=test_code)
    res = run_many([_job(_Run(problem, program, timeout, 0.0), None)], 1)[0]
    result = suite_results(res).get("assert")
    passed = bool(result and result.get("passed"))
    reason = "" if passed else (result or {}).get("reason") or sandbox_reason(res)
    return Verdict(passed, program, reason, details={"sandbox": res.status})
