"""Expected outputs of the differential tests, recorded from the canonical solutions.

Contract of :class:`ExpectedOutputs`: for every problem with :class:`~.harness.IOTests` it
gives the canonical solution's outputs on all inputs (a base64 gzip stream of pickles, one per
input, which the evaluator stores and never unpickles) and per-input times, or the reason the
canonical solution failed on its own inputs. Outputs are recorded by running the canonical
program inside the sandbox (8 GiB address space, 600 s) and cached under
``cache_dir()/eval/expected`` (one JSON object on one line per problem, read and written with
:mod:`elfreg.jsonl`), keyed by the task id, the canonical program, the inputs, the Python version
and :data:`~.harness.HARNESS_VERSION`. An unreadable or corrupt cache entry is recorded again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from elfreg.jsonl import append_jsonl, read_jsonl
from elfreg.paths import cache_dir

from .harness import CODE_LIMITS, HARNESS_VERSION, CodeProblem, harness_job, sandbox_reason, suite_results
from .sandbox import NOT_RUN, SandboxJob, run_many

__all__ = ["ExpectedOutputs", "RECORD_TIMEOUT", "RECORD_MEMORY_MB"]

log = logging.getLogger(__name__)

RECORD_TIMEOUT = 600.0  #: seconds the canonical solution may take on all inputs of one problem
RECORD_MEMORY_MB = 8192  #: address-space limit when recording the canonical outputs


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
                rows = read_jsonl(self._path(key))
            except (OSError, ValueError):  # absent or corrupt: record it again
                return None
            data = rows[0] if len(rows) == 1 else {}
            if "expected" in data and "times" in data:
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
            tmp.unlink(missing_ok=True)
            append_jsonl(tmp, data)
            os.replace(tmp, self._path(key))  # readers see the whole entry or none
        except OSError as err:  # a read-only cache only costs time
            log.warning("could not write expected-output cache %s: %s", self.root, err)

    def get(
        self,
        problems: Sequence[CodeProblem],
        workers: int | None = None,
        progress: Callable[[int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """``task_id → {"expected": base64 pickle, "times": [...]}`` or ``{"error": reason}``.

        Once ``should_stop()`` is true no further recording starts; the problems not recorded map
        to an ``error`` saying so and nothing is cached for them.
        """
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
        results = run_many(jobs, workers, progress=progress, should_stop=should_stop)
        for p, res in zip(todo, results, strict=True):
            if res.status == NOT_RUN:
                out[p.task_id] = {"error": res.reason}
                continue
            record = suite_results(res).get("record")
            if record and record.get("passed") and len(record.get("times", [])) == p.io.n_total:  # type: ignore[union-attr]
                data = {"expected": record["expected"], "times": record["times"]}
                self._store(_key(p), data)
                out[p.task_id] = data
            else:
                why = (record or {}).get("reason") or sandbox_reason(res)
                out[p.task_id] = {"error": f"canonical solution failed on its own inputs: {why}"}
                log.warning("%s: %s", p.task_id, out[p.task_id]["error"])
        return out


def _record_job(p: CodeProblem) -> SandboxJob:
    assert p.io is not None
    suite = {"name": "record", "kind": "record", "entry_point": p.entry_point, "task_id": p.task_id,
             "inputs_file": "inputs.json", "convert": p.io.convert}
    limits = dataclasses.replace(CODE_LIMITS, memory_mb=RECORD_MEMORY_MB, max_channel_bytes=1 << 30)
    return harness_job(p.canonical, [suite], RECORD_TIMEOUT, files={"inputs.json": p.io.inputs_json}, limits=limits)
