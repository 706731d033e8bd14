"""Sandboxed test execution for code problems (HumanEval(+), MBPP(+)).

Each sample becomes one sandboxed run of the test harness (``_harness.py``) on the sanitised
program, with the task's test suites:

* ``assert`` suites run the benchmark's original tests (HumanEval ``check(candidate)``, MBPP
  ``assert`` lines with their setup code);
* the ``io`` suite runs EvalPlus-style differential tests: the entry point on ``base_input +
  plus_input`` against the outputs of the canonical solution, which are recorded once by running
  the canonical solution inside the sandbox and cached on disk (see :class:`ExpectedOutputs`).
  Since base inputs come first and testing stops at the first failure, the base score (base
  inputs only) is read off the same run.

The program is the prompt's context (its imports and helper functions, e.g. HumanEval's
``poly``) followed by the sanitised model program. Identical programs of the same problem are
run once.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import hashlib
import json
import logging
import marshal
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from elfreg.paths import cache_dir

from .code_sanitize import SanitizedProgram, extract_code, parse_quietly, sanitize
from .sandbox import SandboxJob, SandboxLimits, SandboxResult, run_many
from .verdict import Verdict

__all__ = ["IOTests", "CodeProblem", "ExpectedOutputs", "check_code_samples", "check_program", "HARNESS_VERSION"]

log = logging.getLogger(__name__)

HARNESS_VERSION = "5"
_HARNESS_SOURCE = Path(__file__).with_name("_harness.py").read_text(encoding="utf-8")
MIN_TIME_LIMIT = 1.0  #: seconds every differential-test input gets at least (EvalPlus default)
TIME_LIMIT_FACTOR = 4.0  #: × the canonical solution's time on that input (EvalPlus default)
RECORD_TIMEOUT = 600.0  #: seconds the canonical solution may take on all inputs of one problem
RECORD_MEMORY_MB = 8192  #: address-space limit when recording the canonical outputs
#: limits of a tested program (4 GiB address space, as EvalPlus allows)
CODE_LIMITS = SandboxLimits(memory_mb=4096)


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


def _key(problem: CodeProblem) -> str:
    assert problem.io is not None
    text = "|".join([HARNESS_VERSION, sys.version, problem.task_id, problem.canonical, problem.io.digest])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ExpectedOutputs:
    """Expected outputs of the differential tests, recorded from the canonical solutions.

    The canonical program runs inside the sandbox on every input; its outputs come back pickled
    (the evaluator stores them as opaque bytes and never unpickles them; only the sandboxed
    harness does) together with per-input times, which set the per-input time limits. Results are
    cached as JSON under ``cache_dir()/eval/expected`` keyed by the canonical program, the inputs,
    the Python version and the harness version.
    """

    def __init__(self, cache_root: str | os.PathLike | None = None, use_cache: bool = True) -> None:
        self.root = Path(cache_root) if cache_root is not None else cache_dir() / "eval" / "expected"
        self.use_cache = use_cache
        self._memory: dict[str, dict[str, Any]] = {}

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def _load(self, key: str) -> dict[str, Any] | None:
        if key in self._memory:
            return self._memory[key]
        if self.use_cache:
            try:
                data = json.loads(self._path(key).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            if isinstance(data, dict) and "expected" in data and "times" in data:
                self._memory[key] = data
                return data
        return None

    def _store(self, key: str, data: dict[str, Any]) -> None:
        self._memory[key] = data
        if not self.use_cache:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self._path(key).with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self._path(key))
        except OSError as err:  # a read-only cache only costs time
            log.warning("could not write expected-output cache %s: %s", self.root, err)

    def get(
        self,
        problems: Sequence[CodeProblem],
        workers: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """``task_id → {"expected": base64 pickle, "times": [...]}`` or ``{"error": reason}``."""
        out: dict[str, dict[str, Any]] = {}
        todo = []
        for p in problems:
            if p.io is None:
                continue
            cached = self._load(_key(p))
            if cached is not None:
                out[p.task_id] = cached
            else:
                todo.append(p)
        if not todo:
            return out
        jobs = [_record_job(p) for p in todo]
        results = run_many(jobs, workers, progress=progress)
        for p, res in zip(todo, results, strict=True):
            record = _suite_results(res).get("record")
            if record and record.get("passed") and len(record.get("times", [])) == p.io.n_total:  # type: ignore[union-attr]
                data = {"expected": record["expected"], "times": record["times"]}
                self._store(_key(p), data)
                out[p.task_id] = data
            else:
                why = (record or {}).get("reason") or _sandbox_reason(res)
                out[p.task_id] = {"error": f"canonical solution failed on its own inputs: {why}"}
                log.warning("%s: %s", p.task_id, out[p.task_id]["error"])
        return out


def _record_job(p: CodeProblem) -> SandboxJob:
    assert p.io is not None
    spec = {"program_file": "candidate.py",
            "suites": [{"name": "record", "kind": "record", "entry_point": p.entry_point, "task_id": p.task_id,
                        "inputs_file": "inputs.json", "convert": p.io.convert}]}
    files = {"spec.bin": marshal.dumps(spec), "candidate.py": p.canonical, "inputs.json": p.io.inputs_json}
    limits = dataclasses.replace(CODE_LIMITS, memory_mb=RECORD_MEMORY_MB, max_channel_bytes=1 << 30)
    return SandboxJob(_HARNESS_SOURCE, RECORD_TIMEOUT, files, (), limits, channel=True)


def _suite_results(res: SandboxResult) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for line in res.channel.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "suite" in record:
            results[str(record["suite"])] = record
    return results


def _sandbox_reason(res: SandboxResult) -> str:
    if res.status == "ok":
        return "the program exited before its tests finished"
    if res.status == "error":
        return f"the program exited before its tests finished ({res.reason})"
    return f"{res.status}: {res.reason}"


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
    files: dict[str, str | bytes] = {"candidate.py": run.program}
    wall = 5.0
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
    files["spec.bin"] = marshal.dumps({"program_file": "candidate.py", "suites": suites})
    return SandboxJob(_HARNESS_SOURCE, wall, files, (), CODE_LIMITS, channel=True)


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
    """
    expected = expected or ExpectedOutputs()
    io_problems = {s[0].task_id: s[0] for s in samples if s[0].io is not None}
    outputs = expected.get(list(io_problems.values()), workers, record_progress) if io_problems else {}

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
    results = dict(zip(run_keys, run_many(jobs, workers, progress=progress), strict=True))

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
    suites = _suite_results(res)
    details["sandbox"] = res.status
    reasons: dict[str, str] = {}
    verdict_of: dict[str, bool] = {}

    assert_res = suites.get("assert")
    if problem.assert_test is not None:
        verdict_of["assert"] = bool(assert_res and assert_res.get("passed"))
        if not verdict_of["assert"]:
            reasons["assert"] = (assert_res or {}).get("reason") or _sandbox_reason(res)

    if problem.io is not None:
        exp = outputs.get(problem.task_id, {})
        io_res = suites.get("io")
        if "error" in exp or not exp:
            verdict_of["plus"] = verdict_of["io_base"] = False
            reasons["plus"] = reasons["io_base"] = exp.get("error", "expected outputs unavailable")
        elif io_res is None:
            verdict_of["plus"] = verdict_of["io_base"] = False
            reasons["plus"] = reasons["io_base"] = _sandbox_reason(res)
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
