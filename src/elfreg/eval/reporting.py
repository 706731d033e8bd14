"""What an evaluation writes: its output folder, the summary, the printed table and the files.

Contract: :data:`EVAL_FOLDER` is the output folder's kind for :func:`elfreg.runs.claimed` (its
identity is ``eval_config.json``; a sweep's points are subfolders of the same kind, and
:func:`held` holds a sweep's parent folder); :func:`build_summary` lays out ``summary.json``
from the per-problem verdicts of one scoring run (the statistics come from
:func:`elfreg.eval.passk.summarize`); :func:`format_table` prints a summary as a plain-text
table in percent; :func:`write_outputs` writes ``samples.jsonl``, ``summary.json`` and
``table.txt``; :func:`progress_bar` is the progress bar of generation and scoring. Nothing here
checks an output or runs a program. Errors that stop an evaluation are :class:`EvalError` (one
line) and :class:`EvalStopped` (a signal, at a safe point).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import SAMPLERS
from ..jsonl import write_jsonl
from ..runs import FolderKind, check_writable, locked
from .code.sandbox import sandbox_isolation
from .passk import summarize
from .tasks import Task

__all__ = ["EVAL_FOLDER", "PREDICTIONS_NAME", "EvalError", "EvalReport", "EvalStopped", "build_summary",
           "format_table", "held", "progress_bar", "write_outputs"]

PREDICTIONS_NAME = "predictions.jsonl"
#: names of sweep subfolders: ``nfe64``, ``full-span``, ``early-stop-nfe16``
_SWEEP_NAME = re.compile(rf"^(?:(?:{'|'.join(map(re.escape, SAMPLERS))})(?:-nfe\d+)?|nfe\d+)$")


def _sweep_folders(folder: Path) -> list[Path]:
    """Subfolders a sweep wrote: named like a sweep point and holding one of elfreg's files."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and _SWEEP_NAME.match(p.name)
                  and any((p / name).is_file() for name in EVAL_FOLDER.outputs))


#: an evaluation's ``--out``: identity ``eval_config.json``; a sweep's points are subfolders
EVAL_FOLDER = FolderKind(job="evaluation", identity_file="eval_config.json",
                         outputs=(PREDICTIONS_NAME, "samples.jsonl", "summary.json", "table.txt", "eval_config.json"),
                         subfolders=_sweep_folders)


class EvalError(RuntimeError):
    """The evaluation cannot run: a missing checkpoint, a generator returning the wrong number
    of outputs, a predictions file that does not match. The message is one line (exit status 2)."""

    exit_status = 2


class EvalStopped(RuntimeError):
    """The run was stopped by a signal at a safe point; the message says what is saved and how
    to resume."""

    exit_status = 130


@contextlib.contextmanager
def held(folder: str | os.PathLike | None, *, overwrite: bool = False) -> Iterator[None]:
    """Hold the parent folder of a sweep: writable and locked; with ``overwrite`` everything
    elfreg wrote there (its sweep subfolders included) is removed first. Each point's subfolder
    is then claimed on its own (:func:`elfreg.runs.claimed` with :data:`EVAL_FOLDER`), so points
    of an earlier sweep with the same settings resume and points with other settings are refused."""
    if folder is None:
        yield
        return
    check_writable(folder)
    with locked(folder, what=EVAL_FOLDER.what):
        if overwrite:
            EVAL_FOLDER.clear(folder)
        yield

#: how many missing task ids the summary lists
_MISSING_SHOWN = 50
#: how many failure kinds the summary's histogram keeps
_FAILURE_KINDS_SHOWN = 20


@dataclasses.dataclass
class EvalReport:
    """What an evaluation produced."""

    summary: dict[str, Any]  #: the content of ``summary.json``
    records: list[dict[str, Any]]  #: one record per sample (``samples.jsonl``)
    table: str  #: the printed table (``table.txt``)


def _spread(per_problem: Mapping[str, Sequence[bool]]) -> dict[str, int]:
    counts = [len(v) for v in per_problem.values()]
    return {"min": min(counts), "max": max(counts)} if counts else {"min": 0, "max": 0}


def build_summary(
    task: Task,
    selected: Sequence[str],
    per_problem: Mapping[str, Sequence[bool]],
    per_score: Mapping[str, Mapping[str, Sequence[bool]]],
    failures: collections.Counter[str],
    *,
    aliased: int,
    ignored: int,
    alias: bool,
    config: Mapping[str, Any],
    started: float,
    not_scored: int = 0,
) -> dict[str, Any]:
    """The content of ``summary.json``.

    Args:
        task: the scored task.
        selected: task ids of the problems asked for, in benchmark order (coverage is measured
            against them).
        per_problem: ``task_id → [headline verdict of sample 0, 1, …]`` of the scored problems.
        per_score: ``score name → task_id → verdicts`` (code tasks; empty otherwise).
        failures: failure kinds of the failed samples, counted.
        aliased: samples that needed the alias option.
        ignored: predictions left out because their problem was beyond the limit.
        alias: whether the headline score uses the alias option.
        config: settings recorded under ``config`` after the task's own description.
        started: ``time.monotonic()`` when the evaluation started (for ``elapsed_s``).
        not_scored: samples left unchecked because the evaluation was stopped; when > 0 the
            summary is partial (``complete`` false) and its statistics cover the scored samples.
    """
    headline = summarize(per_problem)
    missing = [tid for tid in selected if tid not in per_problem]
    summary: dict[str, Any] = {
        "task": task.name,
        "complete": not_scored == 0,
        "n_not_scored": not_scored,
        "n_problems": headline["n_problems"],
        "n_problems_total": len(selected),
        "coverage": headline["n_problems"] / len(selected) if selected else 0.0,
        "n_missing": len(missing),
        "missing_task_ids": missing[:_MISSING_SHOWN],
        "n_samples": headline["n_samples"],
        "samples_per_problem": _spread(per_problem),
        "pass@1": headline["pass@1"],
        "pass@1_std": headline["pass@1_std"],
        "per_seed": headline["per_seed"],
        **headline["pass@k"],
        "pass@k": headline["pass@k"],
        "headline_score": task.primary_score(alias) or "accuracy",
        "predictions_ignored_by_limit": ignored,
        "failure_reasons": dict(failures.most_common(_FAILURE_KINDS_SHOWN)),
    }
    if task.kind == "code":
        summary["scores"] = {name: summarize(v) for name, v in sorted(per_score.items())}
        summary["alias"] = {"headline_uses_alias": alias, "samples_aliased": aliased}
        summary["sandbox"] = sandbox_isolation()
    summary["config"] = {**task.describe(), **dict(config)}
    summary["elapsed_s"] = round(time.monotonic() - started, 3)
    return summary


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:6.2f}"


def format_table(summary: Mapping[str, Any]) -> str:
    """A plain-text table of the summary (percentages)."""
    head = (
        f"task {summary['task']}: {summary['n_problems']}/{summary['n_problems_total']} problems "
        f"(coverage {100 * summary['coverage']:.1f}%), {summary['n_samples']} samples "
        f"({summary['samples_per_problem']['min']}-{summary['samples_per_problem']['max']} per problem)"
    )
    if not summary.get("complete", True):
        head += f"; PARTIAL: {summary['n_not_scored']} samples not scored (the evaluation was stopped)"
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


def progress_bar(total: int, desc: str, enabled: bool, initial: int = 0) -> Any:
    """A tqdm bar over ``total`` samples, or ``None`` when disabled or empty."""
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    # disable=None: bars only on a terminal, so logs are not flooded
    return tqdm(total=total, initial=initial, desc=desc, unit="sample", dynamic_ncols=True, disable=None,
                mininterval=0.5)


def write_outputs(out_dir: str | os.PathLike, summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                  table: str) -> None:
    """Write ``samples.jsonl``, ``summary.json`` and ``table.txt`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "samples.jsonl", records)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "table.txt").write_text(table, encoding="utf-8")
