"""Score predictions (or generate them from a checkpoint) and write the result files.

:func:`score_predictions` checks every prediction of a task, aggregates pass@1 (mean over
problems and seeds, with the standard deviation across seeds) and pass@k, and optionally writes
``samples.jsonl`` (one record per sample), ``summary.json`` and ``table.txt`` to ``out_dir``.
:func:`evaluate_checkpoint` first generates the outputs through
``elfreg.sampling.api.generate_from_checkpoint`` and saves them as ``predictions.jsonl``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .passk import summarize
from .predictions import Prediction, PredictionError, check_task_ids, parse_prediction_records, read_predictions
from .sandbox import sandbox_isolation
from .tasks import Task, get_task

__all__ = [
    "EvalReport",
    "EvalError",
    "PredictionError",
    "score_predictions",
    "evaluate_checkpoint",
    "format_table",
    "write_outputs",
]


class EvalError(RuntimeError):
    """The evaluation could not run (e.g. the sampling API is missing)."""


@dataclasses.dataclass
class EvalReport:
    """What an evaluation produced."""

    summary: dict[str, Any]  #: the content of ``summary.json``
    records: list[dict[str, Any]]  #: one record per sample (``samples.jsonl``)
    table: str  #: the printed table (``table.txt``)


def _bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    # disable=None: bars only on a terminal, so logs are not flooded
    return tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True, disable=None, mininterval=0.5)


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
    ordered_ids = sorted(by_id, key=selected_ids.__getitem__)
    samples = []
    index = []
    for tid in ordered_ids:
        problem = task_obj.problem(tid)
        for j, p in enumerate(by_id[tid]):
            samples.append((problem, p.text, p.form))
            index.append((tid, j, p))

    bar = _bar(len(samples), f"{task_obj.name}", progress)
    record_bar = None
    if progress and "plus" in task_obj.score_names:
        record_bar = _bar(len(ordered_ids), "reference outputs", True)
    try:
        verdicts = task_obj.check_many(
            samples, workers=workers, timeout=timeout, io_timeout=io_timeout, alias=alias,
            progress=bar.update if bar is not None else None,
            record_progress=record_bar.update if record_bar is not None else None,
        )
    finally:
        for b in (bar, record_bar):
            if b is not None:
                b.close()

    records = []
    per_problem: dict[str, list[bool]] = collections.defaultdict(list)
    per_score: dict[str, dict[str, list[bool]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    reasons: collections.Counter[str] = collections.Counter()
    aliased = 0
    for (tid, j, p), v in zip(index, verdicts, strict=True):
        per_problem[tid].append(v.passed)
        for name, ok in v.scores.items():
            per_score[name][tid].append(ok)
        if not v.passed and v.reason:
            reasons[_reason_kind(v.reason)] += 1
        if v.details.get("aliased_from"):
            aliased += 1
        record = {"task_id": tid, "sample": j, "form": p.form, "output": p.text, "extracted": v.extracted,
                  "passed": v.passed, "reason": v.reason}
        if v.scores:
            record["scores"] = v.scores
        if v.details:
            record["details"] = v.details
        if p.extra:
            record["meta"] = dict(p.extra)
        records.append(record)

    headline = summarize(per_problem)
    missing = [p["task_id"] for p in selected if p["task_id"] not in by_id]
    summary: dict[str, Any] = {
        "task": task_obj.name,
        "n_problems": headline["n_problems"],
        "n_problems_total": len(selected),
        "coverage": headline["n_problems"] / len(selected) if selected else 0.0,
        "n_missing": len(missing),
        "missing_task_ids": missing[:50],
        "n_samples": headline["n_samples"],
        "samples_per_problem": _spread(per_problem),
        "pass@1": headline["pass@1"],
        "pass@1_std": headline["pass@1_std"],
        "per_seed": headline["per_seed"],
        **headline["pass@k"],
        "pass@k": headline["pass@k"],
        "headline_score": task_obj.primary_score(alias) or "accuracy",
        "predictions_ignored_by_limit": ignored,
        "failure_reasons": dict(reasons.most_common(20)),
    }
    if task_obj.kind == "code":
        summary["scores"] = {name: summarize(v) for name, v in sorted(per_score.items())}
        summary["alias"] = {"headline_uses_alias": alias, "samples_aliased": aliased}
        summary["sandbox"] = sandbox_isolation()
    summary["config"] = {
        **task_obj.describe(),
        "limit": limit,
        "workers": workers,
        "timeout": timeout,
        "io_timeout": io_timeout,
        "alias": alias,
        **dict(config or {}),
    }
    summary["elapsed_s"] = round(time.monotonic() - started, 3)
    table = format_table(summary)
    if out_dir is not None:
        write_outputs(out_dir, summary, records, table)
    return EvalReport(summary, records, table)


def _spread(per_problem: Mapping[str, Sequence[bool]]) -> dict[str, int]:
    counts = [len(v) for v in per_problem.values()]
    return {"min": min(counts), "max": max(counts)} if counts else {"min": 0, "max": 0}


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


def _reason_kind(reason: str) -> str:
    """A coarse failure category for the summary's histogram."""
    match = re.search(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b", reason)
    for needle, kind in _KINDS:
        if needle in reason and not (match and needle == "expected "):
            return kind
    return match.group(1) if match else reason[:60]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:6.2f}"


def format_table(summary: Mapping[str, Any]) -> str:
    """A plain-text table of the summary (percentages)."""
    head = (
        f"task {summary['task']}: {summary['n_problems']}/{summary['n_problems_total']} problems "
        f"(coverage {100 * summary['coverage']:.1f}%), {summary['n_samples']} samples "
        f"({summary['samples_per_problem']['min']}-{summary['samples_per_problem']['max']} per problem)"
    )
    rows: list[tuple[str, Mapping[str, Any]]] = []
    if "scores" in summary:
        for name, stats in summary["scores"].items():
            label = name.replace("_noalias", "") + (" (no alias)" if name.endswith("_noalias") else " (alias)")
            rows.append((label, stats))
    else:
        rows.append(("accuracy", summary))
    ks = sorted({k for _, s in rows for k in s["pass@k"]}, key=lambda k: int(k.split("@")[1]))
    ks = [k for k in ks if k != "pass@1"]
    width = max(len(r[0]) for r in rows) + 2
    lines = [head, "", f"{'score':<{width}}{'pass@1':>8}{'±std':>8}" + "".join(f"{k:>10}" for k in ks)]
    for label, stats in rows:
        cells = "".join(f"{_pct(stats['pass@k'].get(k)):>10}" for k in ks)
        lines.append(f"{label:<{width}}{_pct(stats['pass@1']):>8}{_pct(stats['pass@1_std']):>8}{cells}")
    if "scores" in summary:
        lines.append("")
        lines.append(f"headline: {summary['headline_score']}; samples that needed the alias: "
                     f"{summary['alias']['samples_aliased']}; sandbox isolation: {summary['sandbox']}")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: str | os.PathLike, summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                  table: str) -> None:
    """Write ``samples.jsonl``, ``summary.json`` and ``table.txt`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "samples.jsonl").open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "table.txt").write_text(table, encoding="utf-8")


def _generator() -> Any:
    try:
        from elfreg.sampling.api import generate_from_checkpoint
    except ImportError as err:
        raise EvalError(
            "generation needs elfreg.sampling.api.generate_from_checkpoint, which is not available "
            f"({err}); score existing outputs with --predictions instead"
        ) from err
    return generate_from_checkpoint


def evaluate_checkpoint(
    task: str | Task,
    checkpoint: str,
    *,
    samples: int = 16,
    nfe: int = 64,
    sampler: str = "early-stop",
    seed: int = 0,
    limit: int | None = None,
    out_dir: str | os.PathLike | None = None,
    generate_kwargs: Mapping[str, Any] | None = None,
    task_options: Mapping[str, Any] | None = None,
    **score_kwargs: Any,
) -> EvalReport:
    """Generate ``samples`` outputs per prompt from a checkpoint, then score them.

    Sample ``j`` of every prompt is generated with seed ``seed + j``. The outputs are written to
    ``out_dir/predictions.jsonl`` (``solution`` records), so they can be re-scored later.
    Remaining keyword arguments go to :func:`score_predictions`.
    """
    generate = _generator()
    task_obj = task if isinstance(task, Task) else get_task(task, **dict(task_options or {}))
    problems = task_obj.problems()[:limit] if limit is not None else task_obj.problems()
    prompts = [task_obj.prompt(p) for p in problems]
    outputs = generate(checkpoint, prompts, samples=samples, nfe=nfe, sampler=sampler, seed=seed,
                       **dict(generate_kwargs or {}))
    if len(outputs) != len(prompts) or any(len(o) != samples for o in outputs):
        raise EvalError(
            f"generate_from_checkpoint returned {len(outputs)} lists for {len(prompts)} prompts "
            f"(expected {samples} outputs each)"
        )
    records = [
        {"task_id": p["task_id"], "solution": str(text), "seed": seed + j}
        for p, outs in zip(problems, outputs, strict=True)
        for j, text in enumerate(outs)
    ]
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with (Path(out_dir) / "predictions.jsonl").open("w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    config = {"checkpoint": checkpoint, "samples": samples, "nfe": nfe, "sampler": sampler, "seed": seed,
              "generate_kwargs": dict(generate_kwargs or {})}
    config.update(score_kwargs.pop("config", None) or {})
    return score_predictions(task_obj, records, limit=limit, out_dir=out_dir, config=config, **score_kwargs)

