"""A recipe's rows as training examples: sources, row filters, field mapping and the template.

For every source of a data config (:meth:`~elfreg.config.DataConfig.resolved_sources`) each row
is read (:mod:`.sources`), passed through the source's filters in order (the first that fails
drops it and is counted), its columns are mapped onto the template's fields (``prompt_field``
fills the main field, ``fields`` the others) and the example is formatted by
:func:`elfreg.text.templates.format_example`, the function evaluation prompts go through too.

A row without a mapped column, or whose prompt or answer is not a string, is malformed: reading
stops with an error naming the file and line (or row).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..config import DataConfig, FilterConfig, SourceConfig
from ..text.templates import Template, format_example, get_template
from .sources import iter_rows

__all__ = ["RecipeRow", "SourceCounts", "field_value", "filter_label", "recipe_rows", "source_rows"]


@dataclass(frozen=True)
class RecipeRow:
    """One training example of a recipe, with what decontamination compares: the row's own
    question text (``question``, before the template), its answer as written and its group key."""

    where: str
    prompt: str
    answer: str
    question: str
    raw_answer: str
    group: str


@dataclass
class SourceCounts:
    """Rows read from a source, rows each filter dropped, rows that became examples."""

    rows_in: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    rows_out: int = 0


def filter_label(f: FilterConfig) -> str:
    """A filter as text, e.g. ``problem_source in [gsm8k, augmented_gsm8k]``."""
    parts = []
    if f.keep:
        parts.append(f"in [{', '.join(f.keep)}]")
    if f.drop:
        parts.append(f"not in [{', '.join(f.drop)}]")
    if f.min is not None:
        parts.append(f">= {f.min:g}")
    if f.max is not None:
        parts.append(f"<= {f.max:g}")
    if f.pattern is not None:
        parts.append(f"matches /{f.pattern}/")
    return f"{f.field} " + " and ".join(parts)


def _passes(f: FilterConfig, row: dict[str, Any], where: str) -> bool:
    if f.field not in row:
        raise ValueError(f"{where}: filter field '{f.field}' is missing (columns: {', '.join(sorted(row))})")
    value = row[f.field]
    text = "" if value is None else str(value)
    if (f.keep and text not in f.keep) or (f.drop and text in f.drop):
        return False
    if f.min is not None or f.max is not None:
        try:
            number = float(text)
        except ValueError:
            return False  # not a number: fails a numeric bound
        if (f.min is not None and number < f.min) or (f.max is not None and number > f.max):
            return False
    return f.pattern is None or re.search(f.pattern, text) is not None


def field_value(row: dict[str, Any], key: str, where: str, any_type: bool = False) -> Any:
    """``row[key]``, which must be a string unless ``any_type``; a missing or mistyped value is
    an error naming ``where`` (the file and line)."""
    if key not in row or (not any_type and not isinstance(row[key], str)):
        got = "missing" if key not in row else f"{type(row[key]).__name__} {row[key]!r}"
        raise ValueError(f"{where}: field '{key}' must be a string, got {got}")
    return row[key]


def source_rows(src: SourceConfig, template: Template, counts: SourceCounts, data: DataConfig | None = None
                ) -> Iterator[RecipeRow]:
    """The examples of one source, counting into ``counts``."""
    unknown = set(src.fields) - set(template.fields[1:])
    if unknown:
        raise ValueError(f"source {src.label}: fields {sorted(unknown)} are not fields of the {template.name!r} "
                         f"template (its fields: {', '.join(template.fields)})")
    for where, row in iter_rows(src, data):
        counts.rows_in += 1
        failed = next((f for f in src.filters if not _passes(f, row, where)), None)
        if failed is not None:
            label = filter_label(failed)
            counts.filtered[label] = counts.filtered.get(label, 0) + 1
            continue
        question = field_value(row, src.prompt_field, where)
        answer = field_value(row, src.answer_field, where)
        values = {template.main_field: question}
        values.update({name: field_value(row, column, where, any_type=True) for name, column in src.fields.items()})
        try:
            prompt, formatted = format_example(template, values, answer)
        except (KeyError, ValueError) as err:
            raise ValueError(f"{where}: cannot fill the {template.name!r} template ({err})") from None
        group = question if src.group_field is None else str(field_value(row, src.group_field, where, any_type=True))
        counts.rows_out += 1
        yield RecipeRow(where, prompt, formatted, question, answer, group)


def recipe_rows(data: DataConfig, counts: dict[str, SourceCounts] | None = None
                ) -> Iterator[tuple[int, RecipeRow]]:
    """(source index, example) for every example of the recipe, source by source; ``counts``
    (keyed by source label) is filled as rows are read."""
    template = get_template(data.template)
    for i, src in enumerate(data.resolved_sources()):
        tally = SourceCounts() if counts is None else counts.setdefault(src.label, SourceCounts())
        for row in source_rows(src, template, tally, data):
            yield i, row
