"""The data section of the config: templates, benchmarks, sources, filters and mixtures.

Part of :mod:`elfreg.config` (which re-exports every name here); kept apart so each module stays
small. Validation is :meth:`DataConfig.checks`, called by :meth:`elfreg.config.Config.validate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

TEMPLATES = ("gsm8k", "math", "code", "mmlu", "raw")
BENCHMARKS = ("gsm8k", "math500", "humaneval", "mbpp", "mmlu")  # decontamination references
PAPER_RECIPES = ("gsm8k", "math", "code", "mmlu")  # the rows of the paper's Table 8


@dataclass
class FilterConfig:
    """A row filter of a source: the row is kept when its ``field`` passes every criterion given
    (values compared as text; ``min``/``max`` read the value as a number; ``pattern`` is a regex
    searched in the text)."""

    field: str
    keep: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    min: float | None = None
    max: float | None = None
    pattern: str | None = None


@dataclass
class SourceConfig:
    """One source of a mixture: an HF dataset id, a local JSONL/Parquet file or folder, or a
    registered data source (``toy-arith``); its fields, filters and epoch multiplier."""

    kind: str = "hf"  # hf | jsonl | parquet | a registered data source
    path: str = ""  # HF dataset id, or a local file or folder
    name: str = ""  # label in the statistics (default: path)
    config: str | None = None  # HF dataset config
    split: str = "train"
    revision: str | None = None
    prompt_field: str = "prompt"  # the column that fills the template's main field
    answer_field: str = "answer"
    fields: dict[str, str] = field(default_factory=dict)  # other template fields <- columns
    group_field: str | None = None  # decontamination groups rows by this column (default: the prompt)
    filters: list[FilterConfig] = field(default_factory=list)
    epochs: float = 1.0  # times each row is seen per epoch of the mixture (0.5: a fixed half)
    limit: int = 0  # 0: all rows

    @property
    def label(self) -> str:
        return self.name or self.path or self.kind


@dataclass
class DataConfig:
    """Training examples: a toy generator, a local JSONL file, an HF dataset id, or a mixture of
    sources (``source: mixture``, ``sources``) prepared into shards by ``elfreg data prepare``."""

    source: str = "toy-arith"  # toy-arith | toy-code | jsonl | hf | mixture | a registered source
    path: str | None = None  # JSONL file or HF dataset id
    split: str = "train"
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    template: Literal["gsm8k", "math", "code", "mmlu", "raw"] = "raw"  # text/templates.py
    sources: list[SourceConfig] = field(default_factory=list)  # data.source: mixture
    decontaminate: list[str] = field(default_factory=list)  # benchmarks of BENCHMARKS
    jaccard_threshold: float = 0.2  # word 8-gram Jaccard above which a row matches a test item (docs/data.md)
    prepared: str | None = None  # shard folder of elfreg data prepare; training reads it
    shard_rows: int = 250_000  # rows per shard file
    paper: Literal["gsm8k", "math", "code", "mmlu"] | None = None  # Table 8 row this recipe reproduces
    toy_level: int = 1  # toy-arith: 1 one step, 2 two or three chained steps
    toy_max_number: int = 30  # toy-arith operands in 1..toy_max_number
    toy_count: int = 20000  # toy examples drawn (combinations repeat with varied wordings)
    toy_seed: int = 0
    toy_balance: Literal["combination", "tens"] = "combination"  # toy-arith one-step draws: arith.BALANCES
    toy_level1_share: float = 0.0  # toy-arith level 2: share of toy_count that are one-step problems
    limit: int = 0  # 0: all examples

    def resolved_sources(self) -> list[SourceConfig]:
        """The sources of the recipe: ``sources`` for a mixture, else the single source the
        top-level fields describe."""
        if self.source == "mixture":
            return list(self.sources)
        return [SourceConfig(kind=self.source, path=self.path or "", name=self.path or self.source, split=self.split,
                             prompt_field=self.prompt_field, answer_field=self.answer_field, limit=self.limit)]

    def checks(self) -> list[tuple[str, bool, str]]:
        """Range checks of the data section: (key, ok, why)."""
        from ..plugins import DATA_SOURCES, registered_names  # entry points only: no elfreg room

        kinds = {"hf", "jsonl", "parquet", *registered_names(DATA_SOURCES)}
        mixture = self.source == "mixture"
        out = [("data.limit", self.limit >= 0, "must be >= 0 (0: all examples)"),
               ("data.toy_count", self.toy_count >= 1, "must be >= 1"),
               ("data.toy_max_number", self.toy_max_number >= 2, "must be >= 2"),
               ("data.toy_balance", self.toy_balance == "combination" or (
                   self.source == "toy-arith" and (self.toy_level == 1 or self.toy_level1_share > 0)),
                "applies to toy-arith one-step problems (data.toy_level: 1, or a data.toy_level1_share) only; "
                "elsewhere set it to combination"),
               ("data.toy_level1_share", 0 <= self.toy_level1_share < 1, "must be in [0, 1)"),
               ("data.toy_level1_share", self.toy_level1_share == 0 or (self.source == "toy-arith"
                                                                         and self.toy_level == 2),
                "mixes one-step problems into toy-arith chains (data.toy_level: 2) only; elsewhere set it to 0"),
               ("data.source", self.source in kinds | {"mixture"}, f"must be one of {sorted(kinds | {'mixture'})}"),
               ("data.path", self.source not in ("jsonl", "hf") or bool(self.path),
                f"is required for data.source {self.source!r}"),
               ("data.sources", not mixture or bool(self.sources), "must list at least one source for a mixture"),
               ("data.sources", mixture or not self.sources, "is read only with data.source: mixture"),
               ("data.decontaminate", all(b in BENCHMARKS for b in self.decontaminate),
                f"each must be one of {', '.join(BENCHMARKS)}"),
               ("data.jaccard_threshold", 0 < self.jaccard_threshold <= 1, "must be in (0, 1]"),
               ("data.prepared", self.prepared is None or bool(self.prepared.strip()), "must not be empty"),
               ("data.shard_rows", self.shard_rows >= 1, "must be >= 1"),
               ("data.sources", len({s.label for s in self.sources}) == len(self.sources),
                "each source needs its own name (set name: where paths repeat)")]
        for i, s in enumerate(self.sources):
            key = f"data.sources[{i}]"
            out += [(f"{key}.kind", s.kind in kinds, f"must be one of {sorted(kinds)}"),
                    (f"{key}.path", s.kind not in ("hf", "jsonl", "parquet") or bool(s.path), "is required"),
                    (f"{key}.epochs", s.epochs > 0, "must be > 0"), (f"{key}.limit", s.limit >= 0, "must be >= 0")]
            for j, f in enumerate(s.filters):
                fk = f"{key}.filters[{j}]"
                given = [f.keep, f.drop, f.min is not None, f.max is not None, f.pattern is not None]
                out += [(fk, any(given), "needs one of keep, drop, min, max, pattern"),
                        (f"{fk}.max", f.min is None or f.max is None or f.min <= f.max, "must be >= min")]
                if f.pattern is not None:
                    try:
                        re.compile(f.pattern)
                    except re.error as err:
                        out.append((f"{fk}.pattern", False, f"not a regular expression ({err})"))
        return out
