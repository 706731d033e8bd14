"""Scoring predictions: check every sample of a task and aggregate the verdicts per problem.

Contract of :func:`score_predictions`: every prediction of a selected problem is checked by its
task (code runs in the sandbox), sample ``j`` of a problem being the ``j``-th prediction with its
task id (generation seed ``seed + j``); the verdicts are gathered per problem (headline), per
named score (code tasks) and per failure kind, and reported through
:mod:`elfreg.eval.reporting` (pass@1 = mean over problems and seeds with the sample standard
deviation across seeds, pass@k); a corpus task (ELF's XSum, WMT14 De-En, Gen-PPL) is scored seed
by seed as whole corpora instead (:mod:`elfreg.eval.corpus_scoring`). Malformed predictions and unknown task ids raise
:class:`~elfreg.eval.predictions.PredictionError` before anything is checked. Once
``should_stop`` is true no further sample is checked and the report is partial (``complete``
false, the unchecked samples counted apart and left out of every statistic).
:func:`evaluate_predictions` scores a predictions file into an output folder held for it
(:func:`elfreg.runs.claimed`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..provenance import file_sha256
from ..runs import claimed
from .corpus_scoring import score_corpus
from .predictions import Prediction, PredictionError, check_task_ids, parse_prediction_records, read_predictions
from .reporting import EVAL_FOLDER, EvalReport, build_summary, format_table, progress_bar, write_outputs
from .tasks import Task, get_task
from .tasks.elf import CorpusTask
from .verdict import Verdict

__all__ = ["EvalReport", "PredictionError", "Tally", "evaluate_predictions", "reason_kind", "score_predictions",
           "tally_verdicts"]


def _resolve_predictions(predictions: str | os.PathLike | Iterable[Any]) -> tuple[list[Prediction], str]:
    if isinstance(predictions, str | os.PathLike):
        return read_predictions(predictions), str(predictions)
    items = list(predictions)
    if items and all(isinstance(p, Prediction) for p in items):
        return items, "predictions"
    return parse_prediction_records(items), "record"


def score_predictions(
    task: str | Task,
    predictions: str | os.PathLike | Iterable[Mapping[str, Any] | Prediction],
    *,
    workers: int | None = None,
    timeout: float = 10.0,
    io_timeout: float = 60.0,
    alias: bool = True,
    limit: int | None = None,
    progress: bool = False,
    out_dir: str | os.PathLike | None = None,
    task_options: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> EvalReport:
    """Score a task's predictions.

    Args:
        task: a task name (see :func:`elfreg.eval.get_task`) or a :class:`Task`.
        predictions: a JSONL path, or dicts with ``task_id`` and ``completion``/``solution``.
        workers: parallel sandboxes for code tasks (default: CPU count).
        timeout: seconds for each assert test suite (code tasks).
        io_timeout: cap in seconds on the differential tests of one program (HumanEval+/MBPP+).
        alias: headline score with the alias option (both are always reported for code).
        limit: only the first ``limit`` problems of the task.
        progress: show tqdm progress bars.
        out_dir: write ``samples.jsonl``, ``summary.json`` and ``table.txt`` there.
        task_options: options for :func:`get_task` when ``task`` is a name.
        config: extra settings recorded in the summary (e.g. generation settings).
        should_stop: asked before each check (each sandbox launch for code); once true, the
            samples not yet checked are left out and the report is partial: ``summary["complete"]``
            is false and ``summary["n_not_scored"]`` counts them (``samples.jsonl`` holds what was
            scored).

    Raises:
        PredictionError: malformed record, or a task id the task does not have (with its line).
    """
    started = time.monotonic()
    task_obj = task if isinstance(task, Task) else get_task(task, **dict(task_options or {}))
    problems = task_obj.problems()
    selected = problems[:limit] if limit is not None else problems
    selected_ids = {p["task_id"]: i for i, p in enumerate(selected)}
    preds, source = _resolve_predictions(predictions)
    check_task_ids(preds, task_obj.has_task_id, task_obj.name, task_obj.id_pattern, source)

    by_id: dict[str, list[Prediction]] = collections.defaultdict(list)
    ignored = 0
    for p in preds:
        if p.task_id in selected_ids:
            by_id[p.task_id].append(p)
        else:
            ignored += 1
    if isinstance(task_obj, CorpusTask):  # ELF's tasks: metrics of whole corpora, no verdicts
        return score_corpus(task_obj, [p["task_id"] for p in selected], by_id, ignored=ignored,
                            config={"limit": limit, **dict(config or {})}, started=started, out_dir=out_dir,
                            should_stop=should_stop)
    ordered_ids = sorted(by_id, key=selected_ids.__getitem__)
    samples = []
    index = []
    for tid in ordered_ids:
        problem = task_obj.problem(tid)
        for j, p in enumerate(by_id[tid]):
            samples.append((problem, p.text, p.form))
            index.append((tid, j, p))

    bar = progress_bar(len(samples), f"{task_obj.name}", progress)
    record_bar = None
    if progress and "plus" in task_obj.score_names:
        record_bar = progress_bar(len(ordered_ids), "reference outputs", True)
    try:
        verdicts = task_obj.check_many(
            samples, workers=workers, timeout=timeout, io_timeout=io_timeout, alias=alias,
            progress=bar.update if bar is not None else None,
            record_progress=record_bar.update if record_bar is not None else None, should_stop=should_stop,
        )
    finally:
        for b in (bar, record_bar):
            if b is not None:
                b.close()

    scored = [(i, v) for i, v in zip(index, verdicts, strict=True) if v.scored]
    records = [_record(tid, j, p, v) for (tid, j, p), v in scored]
    tally = tally_verdicts([tid for (tid, _, _), _ in scored], [v for _, v in scored])
    settings = {"limit": limit, "workers": workers, "timeout": timeout, "io_timeout": io_timeout, "alias": alias,
                **dict(config or {})}
    summary = build_summary(
        task_obj, [p["task_id"] for p in selected], tally.per_problem, tally.per_score, tally.failures,
        aliased=tally.aliased, ignored=ignored, alias=alias, config=settings, started=started,
        not_scored=len(verdicts) - len(scored),
    )
    table = format_table(summary)
    if out_dir is not None:
        write_outputs(out_dir, summary, records, table)
    return EvalReport(summary, records, table)


def evaluate_predictions(
    task: str | Task,
    predictions: str | os.PathLike,
    *,
    out_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    task_options: Mapping[str, Any] | None = None,
    **score_kwargs: Any,
) -> EvalReport:
    """:func:`score_predictions` of a predictions file into an output folder held for this scoring.

    The folder's identity (:func:`elfreg.runs.claimed`) is the task, the file's absolute
    path and SHA-256, and the scoring options that change verdicts (``limit``, ``timeout``,
    ``io_timeout``, ``alias``): the same scoring again replaces its own results; another one is
    refused unless ``overwrite``.

    Raises:
        PredictionError: the file cannot be read (before the folder is touched), or is malformed.
        RunFolderError: ``out_dir`` is not writable or holds another evaluation.
        FolderInUse: another process holds ``out_dir``.
    """
    path = Path(predictions)
    try:
        digest = file_sha256(path)
    except OSError as err:
        raise PredictionError(f"cannot read predictions file {path}: {err.strerror or err}") from None
    task_obj = task if isinstance(task, Task) else get_task(task, **dict(task_options or {}))
    identity = {"kind": "predictions", **task_obj.identity(), "predictions": str(path.resolve()), "sha256": digest,
                **{k: score_kwargs.get(k, default) for k, default in _VERDICT_OPTIONS.items()}}
    with claimed(out_dir, identity, EVAL_FOLDER, overwrite=overwrite):
        return score_predictions(task_obj, path, out_dir=out_dir, **score_kwargs)


#: the scoring options that can change a verdict, with score_predictions' defaults
_VERDICT_OPTIONS = {"limit": None, "timeout": 10.0, "io_timeout": 60.0, "alias": True}


def _record(task_id: str, sample: int, p: Prediction, v: Verdict) -> dict[str, Any]:
    """One line of ``samples.jsonl``."""
    record = {"task_id": task_id, "sample": sample, "form": p.form, "output": p.text, "extracted": v.extracted,
              "passed": v.passed, "reason": v.reason}
    if v.scores:
        record["scores"] = v.scores
    if v.details:
        record["details"] = v.details
    if p.extra:
        record["meta"] = dict(p.extra)
    return record


@dataclasses.dataclass
class Tally:
    """The verdicts of one scoring run, gathered per problem (in sample order)."""

    per_problem: dict[str, list[bool]]  #: task id → headline verdict of sample 0, 1, …
    per_score: dict[str, dict[str, list[bool]]]  #: score name → task id → verdicts
    failures: collections.Counter[str]  #: failure kind → failed samples
    aliased: int  #: samples that needed the alias option


def tally_verdicts(task_ids: Sequence[str], verdicts: Sequence[Verdict]) -> Tally:
    """Gather ``verdicts[i]`` (a sample of problem ``task_ids[i]``) per problem, score and failure kind."""
    per_problem: dict[str, list[bool]] = collections.defaultdict(list)
    per_score: dict[str, dict[str, list[bool]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    failures: collections.Counter[str] = collections.Counter()
    aliased = 0
    for tid, v in zip(task_ids, verdicts, strict=True):
        per_problem[tid].append(v.passed)
        for name, ok in v.scores.items():
            per_score[name][tid].append(ok)
        if not v.passed and v.reason:
            failures[reason_kind(v.reason)] += 1
        if v.details.get("aliased_from"):
            aliased += 1
    return Tally(per_problem, per_score, failures, aliased)


_KINDS = (
    ("entry point", "entry point missing"),
    ("no valid Python", "no Python code"),
    ("time limit", "timeout"),
    ("wall-clock", "timeout"),
    ("CPU time", "timeout"),
    ("memory", "memory limit"),
    ("output exceeded", "output limit"),
    ("killed by signal", "killed"),
    ("expected ", "wrong answer"),
    ("not equivalent", "wrong answer"),
    ("no number", "no answer found"),
    ("no final answer", "no answer found"),
    ("no option", "no answer found"),
)


def reason_kind(reason: str) -> str:
    """A coarse failure category of a verdict's reason (for the summary's histogram)."""
    match = re.search(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b", reason)
    for needle, kind in _KINDS:
        if needle in reason and not (match and needle == "expected "):
            return kind
    return match.group(1) if match else reason[:60]
