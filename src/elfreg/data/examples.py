"""Training examples (prompt, answer) from a local JSONL file, an HF dataset, or a data source a
package registers (:mod:`elfreg.plugins`; elfreg's toy tasks are registered that way)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import DataConfig
from ..jsonl import iter_jsonl
from ..plugins import DATA_SOURCES, lookup, registered_names


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


def read_jsonl_examples(path: str | Path, prompt_field: str, answer_field: str) -> list[Example]:
    """Read (prompt, answer) pairs from JSONL; a bad line fails with its line number. Both fields
    must be strings: a null or a number is an error, never the text "None"."""
    out = []
    for lineno, row in iter_jsonl(path):
        for key in (prompt_field, answer_field):
            if not isinstance(row.get(key), str):
                got = "missing" if key not in row else f"{type(row[key]).__name__} {row[key]!r}"
                raise ValueError(f"{path}:{lineno}: field '{key}' must be a string, got {got}")
        out.append(Example(row[prompt_field], row[answer_field]))
    return out


def _hf_examples(cfg: DataConfig) -> list[Example]:
    try:
        import datasets
    except ImportError as err:
        raise ImportError("data.source 'hf' needs the 'datasets' package (pip install datasets)") from err
    rows = datasets.load_dataset(cfg.path, split=cfg.split)
    return [Example(str(r[cfg.prompt_field]), str(r[cfg.answer_field])) for r in rows]


def load_examples(cfg: DataConfig) -> list[Example]:
    """The training examples a data config names (``limit`` > 0 keeps the first ``limit``)."""
    if cfg.source == "jsonl":
        if not cfg.path:
            raise ValueError("data.path: a JSONL file is required for data.source 'jsonl'")
        examples = read_jsonl_examples(cfg.path, cfg.prompt_field, cfg.answer_field)
    elif cfg.source == "hf":
        if not cfg.path:
            raise ValueError("data.path: an HF dataset id is required for data.source 'hf'")
        examples = _hf_examples(cfg)
    else:
        loader = lookup(DATA_SOURCES, cfg.source)
        if loader is None:
            known = ", ".join(["jsonl", "hf", *registered_names(DATA_SOURCES)])
            raise ValueError(f"data.source: no installed package provides {cfg.source!r} (known: {known})")
        examples = loader(cfg)
    return examples[: cfg.limit] if cfg.limit else examples
