"""Training examples (prompt, answer) held in memory: a local JSONL file, an HF dataset, or a
data source a package registers (:mod:`elfreg.plugins`; elfreg's toy tasks are registered that
way). Mixtures and paper-scale data are prepared into token shards instead (:mod:`.prepare`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import DataConfig
from ..plugins import DATA_SOURCES, lookup, registered_names


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


def read_jsonl_examples(path: str | Path, prompt_field: str, answer_field: str) -> list[Example]:
    """Read (prompt, answer) pairs from JSONL; a bad line fails with its line number. Both fields
    must be strings: a null or a number is an error, never the text "None"."""
    return load_examples(DataConfig(source="jsonl", path=str(path), prompt_field=prompt_field,
                                    answer_field=answer_field))


def load_examples(cfg: DataConfig) -> list[Example]:
    """The training examples a data config names (``limit`` > 0 keeps the first ``limit``),
    each formatted by ``cfg.template``. A registered source with the ``raw`` template returns
    its examples as it made them."""
    from .recipe import recipe_rows

    if cfg.source == "mixture":
        raise ValueError("data.source 'mixture' trains from prepared shards: run `elfreg data prepare --config "
                         "FILE --out DIR` and set data.prepared: DIR")
    if cfg.source in ("jsonl", "hf"):
        if not cfg.path:
            raise ValueError(f"data.path: a {'JSONL file' if cfg.source == 'jsonl' else 'HF dataset id'} is required "
                             f"for data.source {cfg.source!r}")
        return [Example(row.prompt, row.answer) for _, row in recipe_rows(cfg)]
    loader = lookup(DATA_SOURCES, cfg.source)
    if loader is None:
        known = ", ".join(["jsonl", "hf", "mixture", *registered_names(DATA_SOURCES)])
        raise ValueError(f"data.source: no installed package provides {cfg.source!r} (known: {known})")
    if cfg.template != "raw":
        return [Example(row.prompt, row.answer) for _, row in recipe_rows(cfg)]
    examples = loader(cfg)
    return examples[: cfg.limit] if cfg.limit else examples
