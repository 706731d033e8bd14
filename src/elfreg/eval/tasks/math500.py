"""MATH-500 answer extraction and checking with ``math-verify`` 0.9.0.

* :func:`extract_math_answer` takes the content of the **last** ``\\boxed{…}`` (or ``\\fbox{…}``)
  of the output; without one, the text after the last "final answer is" / "answer is" /
  "answer:" (surrounding ``$`` and a trailing period removed); otherwise ``None``.
* :func:`math_equal` parses the reference and the extracted answer with ``math_verify.parse``
  (each wrapped in ``$…$``) and compares them with ``math_verify.verify`` (symbolic and numeric
  equivalence; gold first). When no answer could be extracted, ``math_verify.parse`` is run on
  the whole output with its default extraction (last LaTeX/expression) as a final fallback.

``math-verify`` times out through ``signal.alarm``, which works only in the main thread; from
other threads the timeouts are switched off. The reference is parsed without a time limit: it is
the benchmark's own text, and a wall-clock limit would make its verdict depend on the machine's
load (the first parse of a process also builds math-verify's LaTeX parser, seconds on a busy CPU).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from ..verdict import Verdict

__all__ = ["extract_math_answer", "last_boxed", "math_equal", "check_math"]

_PHRASE = re.compile(r"(?:final\s+answer\s*(?:is)?\s*:?|answer\s*(?:is\s*:?|:))", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}``/``\\fbox{…}`` (balanced braces), or ``None``."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        # "\boxed 5" form
        rest = text[start + len("\\boxed") :].strip().split()
        return rest[0].rstrip("$.") if rest else None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None


def extract_math_answer(text: str) -> str | None:
    """The final answer of a MATH-style solution (see the module docstring), or ``None``."""
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    phrases = list(_PHRASE.finditer(text))
    if phrases:
        tail = text[phrases[-1].end() :].strip()
        line = tail.split("\n", 1)[0].strip()
        line = line.strip("$ ").rstrip(".").strip("$ ")
        if line:
            return line
    return None


def _parse(text: str, reference: bool = False) -> list[Any]:
    from math_verify import parse

    timed = not reference and threading.current_thread() is threading.main_thread()
    return parse(text, **({} if timed else {"parsing_timeout": None}))


def _verify(gold: list[Any], pred: list[Any]) -> bool:
    from math_verify import verify

    kwargs = {} if threading.current_thread() is threading.main_thread() else {"timeout_seconds": None}
    return bool(verify(gold, pred, **kwargs))


def check_math(output: str, gold: str) -> Verdict:
    """Check a model output against a MATH reference answer with math-verify."""
    gold_parsed = _parse(f"${gold}$", reference=True)
    if not gold_parsed:
        return Verdict(False, None, f"math-verify cannot parse the reference {gold!r}")
    extracted = extract_math_answer(output)
    if extracted is not None:
        pred = _parse(f"${extracted}$")
        if not pred:
            return Verdict(False, extracted, "math-verify cannot parse the extracted answer")
    else:
        pred = _parse(output or "")
        if not pred:
            return Verdict(False, None, "no final answer found")
        extracted = str(pred[-1])
    ok = _verify(gold_parsed, pred)
    return Verdict(ok, extracted, "" if ok else "not equivalent to the reference")


def math_equal(predicted: str, gold: str) -> bool:
    """Whether the answer string ``predicted`` is equivalent to ``gold`` under math-verify."""
    gold_parsed = _parse(f"${gold}$", reference=True)
    pred = _parse(f"${predicted}$")
    return bool(gold_parsed and pred and _verify(gold_parsed, pred))
