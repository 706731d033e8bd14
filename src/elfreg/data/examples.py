"""Training examples (prompt, answer) from a local JSONL file, an HF dataset, or a data source a
package registers (:mod:`elfreg.plugins`; elfreg's toy tasks are registered that way)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..config import DataConfig
from ..plugins import DATA_SOURCES, lookup, registered_names


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


def read_jsonl_examples(path: str | Path, prompt_field: str, answer_field: str) -> list[Example]:
    """Read (prompt, answer) pairs from JSONL; a bad line fails with its line number."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(Example(str(row[prompt_field]), str(row[answer_field])))
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with '{prompt_field}' and "
                                 f"'{answer_field}' ({err.__class__.__name__}: {err})") from None
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
