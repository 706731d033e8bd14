"""Decontamination: drop training rows whose question (or, for code, whose solution) is a
benchmark's test item, together with every row of the same group.

Rules, tried in this order for each row against every test item (:mod:`.references`):

- ``exact``: the normalised question (:func:`~.normalize.normalize_text`) equals a test item's;
- ``8gram``: the Jaccard similarity of the two sets of normalised word 8-grams is above the
  threshold (``data.jaccard_threshold``, default 0.2; a text of fewer than 8 words is one gram);
- ``ast``: a top-level function or class of the row's answer has the syntax tree of one in a
  test item's reference program (comments, docstrings and formatting ignored; code benchmarks).

Rows are grouped by their normalised question (or by ``group_field``, e.g. MetaMathQA's
``original_question``, which ties every rewrite to the question it was made from). A group with
any matching row (or whose group text itself matches) is dropped whole; rows dropped only for
their group get rule ``group`` and the test item their group matched. Two passes over the rows,
holding only the keys of contaminated groups, keep memory bounded for any input size.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .normalize import function_fingerprints, normalize_text, word_ngrams, words
from .references import BenchmarkItem

__all__ = ["RULES", "Decontaminator", "Match", "ReferenceIndex", "DecontaminationCounts"]

RULES = ("exact", "8gram", "ast", "group")


@dataclass(frozen=True)
class Match:
    """Why a row is dropped: the rule, the test item and the similarity (1 for exact and ast)."""

    rule: str
    item: BenchmarkItem
    similarity: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "benchmark": self.item.benchmark, "test_id": self.item.id,
                "similarity": round(self.similarity, 4), "test_text": self.item.text}


class ReferenceIndex:
    """The test items indexed for the three rules: normalised texts, an inverted index of
    8-grams (only items sharing a gram with a row are scored) and program fingerprints."""

    def __init__(self, items: list[BenchmarkItem], threshold: float = 0.2, n: int = 8):
        self.items, self.threshold, self.n = items, threshold, n
        self.exact: dict[str, int] = {}
        self.grams: list[frozenset] = []
        self.by_gram: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.programs: dict[str, int] = {}
        for i, item in enumerate(items):
            tokens = words(item.text)
            self.exact.setdefault(" ".join(tokens), i)
            self.grams.append(word_ngrams(tokens, n))
            for gram in self.grams[-1]:
                self.by_gram[gram].append(i)
            for solution in item.solutions:
                for fingerprint in function_fingerprints(solution):
                    self.programs.setdefault(fingerprint, i)

    def match(self, question: str, answer: str | None = None) -> Match | None:
        """The first rule ``question`` (and ``answer``) meets, or ``None``."""
        tokens = words(question)
        hit = self.exact.get(" ".join(tokens))
        if hit is not None and tokens:
            return Match("exact", self.items[hit])
        grams = word_ngrams(tokens, self.n)
        shared = Counter(i for gram in grams for i in self.by_gram.get(gram, ()))
        best, best_j = None, 0.0
        for i, common in shared.items():
            j = common / (len(grams) + len(self.grams[i]) - common)
            if j > best_j:
                best, best_j = i, j
        if best is not None and best_j > self.threshold:
            return Match("8gram", self.items[best], best_j)
        if answer and self.programs:
            for fingerprint in function_fingerprints(answer):
                if fingerprint in self.programs:
                    return Match("ast", self.items[self.programs[fingerprint]])
        return None


@dataclass
class DecontaminationCounts:
    """Rows seen and kept, rows dropped per rule and per benchmark, groups dropped."""

    rows_in: int = 0
    rows_kept: int = 0
    groups_dropped: int = 0
    by_rule: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    by_benchmark: dict[str, int] = field(default_factory=dict)

    @property
    def rows_dropped(self) -> int:
        return self.rows_in - self.rows_kept

    def as_dict(self) -> dict[str, Any]:
        return {"rows_in": self.rows_in, "rows_kept": self.rows_kept, "rows_dropped": self.rows_dropped,
                "groups_dropped": self.groups_dropped, "by_rule": dict(self.by_rule),
                "by_benchmark": dict(self.by_benchmark)}


# (question, answer or None, group text) of a row
Fields = tuple[str, str | None, str]


class Decontaminator:
    """Two passes over the same rows: :meth:`scan` finds the contaminated groups, :meth:`decide`
    then says, row by row, whether it is dropped and why (counting into :attr:`counts`)."""

    def __init__(self, index: ReferenceIndex):
        self.index = index
        self.contaminated: dict[str, Match] = {}
        self.counts = DecontaminationCounts()

    def scan(self, rows: Iterable[Fields]) -> None:
        """Pass 1: remember the group key of every row that matches a test item (or whose group
        text, e.g. the original question of a rewrite, does)."""
        for question, answer, group in rows:
            key = normalize_text(group)
            if key in self.contaminated:
                continue
            found = self.index.match(question, answer)
            if found is None and group != question:
                found = self.index.match(group)  # the question a group was made from
            if found is not None:
                self.contaminated[key] = found
        self.counts.groups_dropped = len(self.contaminated)

    def decide(self, question: str, answer: str | None, group: str) -> Match | None:
        """Pass 2: why this row is dropped (its own match, or ``group``), or ``None`` to keep it."""
        self.counts.rows_in += 1
        matched = self.contaminated.get(normalize_text(group))
        if matched is None:
            self.counts.rows_kept += 1
            return None
        own = self.index.match(question, answer)
        why = own if own is not None else Match("group", matched.item, matched.similarity)
        self.counts.by_rule[why.rule] += 1
        self.counts.by_benchmark[why.item.benchmark] = self.counts.by_benchmark.get(why.item.benchmark, 0) + 1
        return why

    def filter(self, rows: Callable[[], Iterator[Any]], fields: Callable[[Any], Fields]
               ) -> Iterator[tuple[Any, Match | None]]:
        """Both passes over ``rows()`` (called twice): every row with its verdict."""
        self.scan(fields(row) for row in rows())
        for row in rows():
            yield row, self.decide(*fields(row))


def _row_fields(where: str, row: dict[str, Any], prompt_field: str, answer_field: str | None,
                group_field: str | None) -> Fields:
    from .recipe import field_value

    question, answer, group = (None if key is None else field_value(row, key, where)
                               for key in (prompt_field, answer_field, group_field))
    return question, answer, group if group is not None else question


def decontaminate_file(path: str, prompt_field: str, against: list[str], out_dir: str,
                       answer_field: str | None = None, group_field: str | None = None, threshold: float = 0.2,
                       data_dir: str | None = None) -> DecontaminationCounts:
    """Decontaminate a JSONL or Parquet file (or folder) against the benchmarks ``against``:
    writes ``kept.jsonl`` (the rows kept, as they were), ``dropped.jsonl`` (each dropped row with
    a ``decontamination`` record: rule, benchmark, test id, similarity, test text) and
    ``counts.json`` into ``out_dir``; returns the counts."""
    import json
    from pathlib import Path

    from ..config import SourceConfig
    from ..jsonl import jsonl_writer
    from .references import load_references
    from .sources import iter_rows

    kind = "parquet" if str(path).endswith(".parquet") else "jsonl"
    source = SourceConfig(kind=kind, path=str(path))
    decon = Decontaminator(ReferenceIndex(load_references(against, data_dir), threshold))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with jsonl_writer(out / "kept.jsonl", default=str) as kept, \
            jsonl_writer(out / "dropped.jsonl", default=str) as dropped:
        for (where, row), why in decon.filter(lambda: iter_rows(source), lambda r: _row_fields(
                r[0], r[1], prompt_field, answer_field, group_field)):
            if why is None:
                kept(row)
            else:
                dropped({**row, "decontamination": {**why.as_dict(), "row": where}})
    summary = {"input": str(path), "against": against, "threshold": threshold, "ngram": decon.index.n,
               "test_items": len(decon.index.items), **decon.counts.as_dict()}
    (out / "counts.json").write_text(json.dumps(summary, indent=2) + "\n")
    return decon.counts
