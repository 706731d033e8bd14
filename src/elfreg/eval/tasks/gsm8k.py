"""GSM8K answer extraction and numeric comparison.

:func:`extract_gsm8k_answer` reads the final number of a worked solution, trying in order:

1. the text after the **last** ``####`` (GSM8K's own format, e.g. ``#### 1,234``);
2. the text after the last "answer is" / "answer:" (e.g. ``The answer is $1,234.50.``,
   ``Final answer: -3``);
3. the last ``\\boxed{…}`` (e.g. ``\\boxed{18}``);
4. otherwise the last number anywhere in the text.

In 1–3 the first number in the located text is taken. A number may carry a sign (``-``, ``−``),
a ``$``, thousands commas (``1,234,567``), decimals and a ``/`` fraction (``3/4``); signs,
``$``, commas and spaces are removed and a trailing sentence period is not part of it. The result
is the normalised string (``"1234.50"``), or ``None`` when no number is found.

:func:`numbers_equal` compares two such strings exactly as rational numbers
(``"1234.50" == "1234.5"``, ``"0.75" == "3/4"``, ``"-5" != "5"``).
"""

from __future__ import annotations

import re
from fractions import Fraction

from .math500 import last_boxed

__all__ = ["extract_gsm8k_answer", "parse_number", "numbers_equal", "gsm8k_gold_answer"]

_MINUS = "-\u2212\u2013"  # hyphen-minus, minus sign, en dash
_NUMBER = re.compile(
    r"(?<![\w.)\]}])"  # not glued to a word, a closing bracket or a decimal point
    rf"(?P<sign>[{_MINUS}])?\s*\$?\s*"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+)?"
    r"(?P<frac>\.\d+)?"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?"
)
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)


def _numbers(text: str) -> list[str]:
    found = []
    for m in _NUMBER.finditer(text):
        if not (m.group("int") or m.group("frac")):
            continue
        sign = "-" if m.group("sign") else ""
        value = (m.group("int") or "0").replace(",", "") + (m.group("frac") or "")
        if m.group("den"):
            value += "/" + m.group("den")
        found.append(sign + value)
    return found


def extract_gsm8k_answer(text: str) -> str | None:
    """The final numeric answer of a GSM8K-style solution, normalised, or ``None``.

    >>> extract_gsm8k_answer("She pays 2 * 617 = 1,234 dollars.\\n#### 1,234")
    '1234'
    >>> extract_gsm8k_answer("The answer is $1,234.50.")
    '1234.50'
    """
    if not text:
        return None
    if "####" in text:
        nums = _numbers(text[text.rfind("####") + 4 :])
        if nums:
            return nums[0]
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        nums = _numbers(text[phrases[-1].end() :])
        if nums:
            return nums[0]
    boxed = last_boxed(text)
    if boxed is not None:
        nums = _numbers(boxed)
        if nums:
            return nums[0]
    nums = _numbers(text)
    return nums[-1] if nums else None


def parse_number(text: str | None) -> Fraction | None:
    """``text`` as an exact rational (commas, ``$``, spaces and a trailing period ignored)."""
    if text is None:
        return None
    cleaned = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    for ch in _MINUS[1:]:
        cleaned = cleaned.replace(ch, "-")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(predicted: str | None, gold: str | None) -> bool:
    """Whether two numeric strings denote the same number (exact rational comparison).

    Falls back to string equality when either side is not a number; ``None`` never matches.
    """
    if predicted is None or gold is None:
        return False
    a, b = parse_number(predicted), parse_number(gold)
    if a is None or b is None:
        return predicted.strip() == gold.strip()
    return a == b


def gsm8k_gold_answer(answer_field: str) -> str:
    """The gold answer of a GSM8K record: the text after ``####``, commas removed."""
    return answer_field.rsplit("####", 1)[-1].strip().replace(",", "")
