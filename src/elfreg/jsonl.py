"""The one JSONL reader and writer of elfreg: one JSON object per line, UTF-8.

Every reading error names the file and the line (``data.jsonl:12: ...``): bytes that are not
UTF-8, a line that is not JSON, a JSON value that is not an object. Blank lines are skipped; a
``.gz`` file is read through gzip. Appending writes one line and flushes it, so a file being
written by a long job holds only whole records up to the last flush, and a reader of a file cut
mid-line by a crash names that line; :func:`drop_cut_last_line` removes such a cut tail so that
the job can append again. A whole file (:func:`write_jsonl`, :func:`jsonl_writer`) is written
through a temporary file renamed into place, so it is never seen half-written.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of ``path``."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text ({err.reason} at byte {err.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record


def read_jsonl(path: str | Path, missing_ok: bool = False) -> list[dict[str, Any]]:
    """Every object of ``path`` (``[]`` for a missing file when ``missing_ok``)."""
    if missing_ok and not Path(path).exists():
        return []
    return [record for _, record in iter_jsonl(path)]


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one object as one line and flush it."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()


@contextmanager
def jsonl_writer(path: str | Path, default: Callable[[Any], Any] | None = None
                 ) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """``with jsonl_writer(path) as write: write(record)``: a whole file of one object a line,
    written through a temporary file that replaces ``path`` only when the block ends without an
    error, so a job that fails midway leaves the old file (or none), never half a file.
    ``default`` is :func:`json.dumps`'s (e.g. ``str`` for values JSON cannot hold)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield lambda record: f.write(json.dumps(record, ensure_ascii=False, default=default) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]], default: Callable[[Any], Any] | None = None
                ) -> None:
    """Write ``records`` to ``path`` whole (:func:`jsonl_writer`)."""
    with jsonl_writer(path, default) as write:
        for record in records:
            write(record)


def drop_cut_last_line(path: str | Path) -> int | None:
    """Make ``path`` end with a whole line again after a writer was killed mid-line.

    Only the last line is looked at, and only when the file does not end with a newline: if that
    line is not a JSON value it is cut off (the file is truncated to the end of the line before)
    and its 1-based line number is returned; a complete value that only lacks its newline gets
    the newline. Returns ``None`` when nothing was dropped. Lines before the last are not read,
    so a corrupt line in the middle is still reported by :func:`iter_jsonl` with its number.
    """
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return None
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return None
        start, block = end, 1 << 16
        while start > 0:  # walk back to the last newline without reading the whole file
            step = min(block, start)
            f.seek(start - step)
            chunk = f.read(step)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start = start - step + cut + 1
                break
            start -= step
        f.seek(start)
        tail = f.read()
        try:
            json.loads(tail)
        except ValueError:  # cut mid-record (UnicodeDecodeError is a ValueError too)
            f.seek(0)
            lineno = 1 + sum(f.read(min(1 << 20, start - pos)).count(b"\n") for pos in range(0, start, 1 << 20))
            f.truncate(start)
            return lineno
        f.write(b"\n")
        return None
