"""The rows of one source: an HF dataset (``datasets.load_dataset``), a local JSONL or Parquet
file or folder, or a data source a package registers (:mod:`elfreg.plugins`; the toy tasks).

Rows are read one at a time (Parquet in record batches, HF datasets from their memory-mapped
cache), so a source of any size streams through in bounded memory. Each row comes with where it
is — ``file.jsonl:12``, ``file.parquet:row 7``, ``org/name[train]:row 3`` — for error messages.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..config import DataConfig, SourceConfig
from ..jsonl import iter_jsonl
from ..plugins import DATA_SOURCES, lookup, registered_names

__all__ = ["iter_rows", "local_files"]

Located = tuple[str, dict[str, Any]]
_SUFFIXES = {"jsonl": (".jsonl",), "parquet": (".parquet",)}


def local_files(path: str | Path, kind: str) -> list[Path]:
    """The files of a local source: ``path`` itself, or the ``.jsonl`` / ``.parquet`` files of
    the folder ``path`` (recursively, in name order)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(_SUFFIXES[kind]))
        if not files:
            raise FileNotFoundError(errno.ENOENT, f"no {'/'.join(_SUFFIXES[kind])} files in this folder", str(path))
        return files
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, "no such file or folder", str(path))
    return [path]


def _jsonl_rows(path: Path) -> Iterator[Located]:
    for lineno, row in iter_jsonl(path):
        yield f"{path}:{lineno}", row


def _parquet_rows(path: Path) -> Iterator[Located]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError("Parquet sources need the 'pyarrow' package (pip install 'elfreg[data]')") from err
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
        for row in batch.to_pylist():
            n += 1
            yield f"{path}:row {n}", row


def _hf_rows(src: SourceConfig) -> Iterator[Located]:
    try:
        import datasets
    except ImportError as err:
        raise ImportError("HF sources need the 'datasets' package (pip install 'elfreg[data]')") from err
    rows = datasets.load_dataset(src.path, src.config, split=src.split, revision=src.revision)
    for i, row in enumerate(rows):
        yield f"{src.path}[{src.split}]:row {i + 1}", row


def _registered_rows(src: SourceConfig, data: DataConfig) -> Iterator[Located]:
    loader = lookup(DATA_SOURCES, src.kind)
    if loader is None:
        known = ", ".join(["hf", "jsonl", "parquet", *registered_names(DATA_SOURCES)])
        raise ValueError(f"data source kind {src.kind!r}: no installed package provides it (known: {known})")
    examples = loader(dataclasses.replace(data, source=src.kind, split=src.split, sources=[]))
    for i, example in enumerate(examples):
        yield f"{src.kind}:example {i + 1}", {"prompt": example.prompt, "answer": example.answer}


def iter_rows(src: SourceConfig, data: DataConfig | None = None) -> Iterator[Located]:
    """(where, row) for every row of ``src`` (the first ``src.limit`` when it is > 0). ``data``
    gives a registered source its settings (``toy_count`` …)."""
    if src.kind == "hf":
        rows = _hf_rows(src)
    elif src.kind in _SUFFIXES:
        reader = _jsonl_rows if src.kind == "jsonl" else _parquet_rows
        rows = (item for f in local_files(src.path, src.kind) for item in reader(f))
    else:
        rows = _registered_rows(src, data or DataConfig())
    for n, item in enumerate(rows, start=1):
        yield item
        if src.limit and n >= src.limit:
            return
