"""MMLU: option-letter extraction from a rationale, and row normalisation.

:func:`extract_choice` returns the chosen letter (``A``–``D``), trying in order:

1. the last "answer is X" / "answer: X" / "answer is (X)" ("answer" in any case, the letter
   upper-case; optional ``**``, ``(``, ``$``, ``\\boxed{``/``\\text{``);
2. the last ``\\boxed{X}``;
3. the last line that is only the letter, in any of ``X``, ``(X)``, ``X.``, ``X)``;
4. an output that *starts* with the letter followed by ``.``, ``)`` or ``:`` (``B. Paris``);
5. the last parenthesised letter ``(X)`` anywhere.

Letters are accepted only in these framings, so words such as "A" in "A man" are not read as
answers. Returns ``None`` when nothing matches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...text.templates import LETTERS

__all__ = ["extract_choice", "LETTERS", "normalize_mmlu_row"]

_L = "[A-D]"
_PHRASE = re.compile(
    r"(?i:answer\s*(?:is|:))\s*[:\s]*(?:\*\*)?\s*(?:\$)?\s*(?:\\boxed\{|\\text\{|\\textbf\{)?\s*\(?\s*"
    rf"({_L})\b(?!['\w])"
)
_BOXED = re.compile(rf"\\boxed\{{\s*(?:\\text\{{)?\s*\(?({_L})\)?\s*\}}")
_LINE = re.compile(rf"^\s*(?:\*\*)?\(?({_L})[).]?(?:\*\*)?\s*$", re.MULTILINE)
_LEADING = re.compile(rf"^\s*\(?({_L})[).:](?:\s|$)")
_PAREN = re.compile(rf"\(({_L})\)")


def extract_choice(text: str) -> str | None:
    """The option letter chosen in ``text`` (rules in the module docstring), or ``None``."""
    if not text:
        return None
    for pattern in (_PHRASE, _BOXED, _LINE):
        found = pattern.findall(text)
        if found:
            return found[-1]
    m = _LEADING.match(text)
    if m:
        return m.group(1)
    found = _PAREN.findall(text)
    return found[-1] if found else None


def normalize_mmlu_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One MMLU question in a common form: ``question``, ``choices`` (4), ``answer`` (letter),
    ``subject``. Accepts the local format (``answer_a``…``answer_d``, ``correct_answer``,
    ``topic``) and the hub format (``choices``, integer ``answer``, ``subject``)."""
    if "answer_a" in row:
        choices = [str(row[f"answer_{c}"]) for c in "abcd"]
        answer = str(row["correct_answer"]).strip().upper()
        subject = str(row.get("topic", ""))
    else:
        choices = [str(c) for c in row["choices"]]
        raw = row["answer"]
        answer = LETTERS[int(raw)] if not isinstance(raw, str) or raw.isdigit() else raw.strip().upper()
        subject = str(row.get("subject", "")).replace("_", " ")
    if len(choices) != 4 or answer not in LETTERS:
        raise ValueError(f"malformed MMLU row: {dict(row)!r:.200}")
    return {"question": str(row["question"]), "choices": choices, "answer": answer, "subject": subject}
