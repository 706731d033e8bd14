"""What decontamination compares: normalised text, word n-grams and their Jaccard similarity,
and the syntax trees of programs with comments, docstrings and formatting left out.

Text normalisation: Unicode NFKC, lower case, apostrophes dropped (``Janet's`` → ``janets``),
thousands commas inside numbers dropped (``1,000`` → ``1000``), then the words are the runs of
letters and the numbers (digits with their decimal points: ``3.5`` stays one word); every other
character (punctuation, symbols, white space) only separates words.
"""

from __future__ import annotations

import ast
import re
import unicodedata

from ..eval.code.sanitize import parse_quietly

__all__ = ["code_blocks", "function_fingerprints", "jaccard", "normalize_text", "word_ngrams", "words"]

_APOSTROPHES = re.compile(r"['\u2019`]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_WORD = re.compile(r"\d+(?:\.\d+)*|[^\W\d_]+")
_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def words(text: str) -> list[str]:
    """The normalised words of ``text`` (rules in the module docstring)."""
    text = unicodedata.normalize("NFKC", text).lower()
    return _WORD.findall(_THOUSANDS.sub("", _APOSTROPHES.sub("", text)))


def normalize_text(text: str) -> str:
    """``text`` as its normalised words joined by single spaces."""
    return " ".join(words(text))


def word_ngrams(tokens: list[str], n: int = 8) -> frozenset[tuple[str, ...]]:
    """The set of word n-grams; a text shorter than ``n`` words is one gram of all its words."""
    if len(tokens) < n:
        return frozenset([tuple(tokens)]) if tokens else frozenset()
    return frozenset(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    """|a ∩ b| / |a ∪ b| (0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def code_blocks(text: str) -> list[str]:
    """The Python code of a solution: its fenced ```python blocks, or the whole text."""
    blocks = _FENCE.findall(text)
    return blocks if blocks else [text]


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]


def function_fingerprints(text: str) -> frozenset[str]:
    """One fingerprint per top-level function or class of the code in ``text``: its syntax tree
    without docstrings, positions or comments, so reformatting and comments do not change it.
    Code that does not parse gives none."""
    out = set()
    for block in code_blocks(text):
        try:
            tree = parse_quietly(block.replace("\r\n", "\n"))
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        _strip_docstrings(tree)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.add(ast.dump(node, include_attributes=False))
    return frozenset(out)
