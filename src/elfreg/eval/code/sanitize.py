"""Turn a model's raw output into the program that is tested (EvalPlus-style sanitising).

Two steps:

1. :func:`extract_code` finds the Python in the output: the fenced Markdown block (```` ``` ````
   or ```` ```python ````; an unterminated last fence counts) that defines the expected function,
   else the longest block that parses; without fences, the longest run of lines that parses as
   Python (prose before or after is dropped, and so is a truncated last line).
2. :func:`sanitize` keeps what the target needs: every import (also ``try``/``if`` blocks made
   of imports and their fallbacks), the target function and the top-level functions, classes and
   global assignments it uses, transitively (plus anything the tests themselves reference).
   Test code, prints, ``if __name__ == "__main__":`` blocks and other top-level statements are
   dropped.

The *alias option*: when the expected name is not defined but the program has exactly one
top-level function, that function is kept and ``expected = that_function`` is appended. Scores
are reported with and without this option (paper Table 15).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import warnings
from collections.abc import Iterable

__all__ = ["SanitizedProgram", "extract_code", "sanitize", "prompt_context", "parse_quietly"]

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*$", re.MULTILINE)
_CODE_LANGS = {"", "python", "py", "python3", "py3"}


def parse_quietly(source: str) -> ast.Module:
    """``ast.parse`` without the warnings (invalid escape sequences …) that model code triggers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source)


def _parses(source: str) -> bool:
    try:
        parse_quietly(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def _fenced_blocks(text: str) -> list[str]:
    blocks = []
    marks = list(_FENCE.finditer(text))
    i = 0
    while i < len(marks):
        opening = marks[i]
        lang = opening.group(1).lower()
        body_start = opening.end() + 1
        if i + 1 < len(marks):
            body = text[body_start : marks[i + 1].start()]
            i += 2
        else:  # unterminated fence: the rest of the output
            body = text[body_start:]
            i += 1
        if lang in _CODE_LANGS:
            blocks.append(body)
    return blocks


def _defines(source: str, name: str) -> bool:
    try:
        tree = parse_quietly(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return name in _top_level_names(tree)


def _longest_valid_run(text: str) -> str:
    """The longest run of whole lines that parses as Python and starts at column 0."""
    lines = text.splitlines()
    best = ""
    best_len = 0
    starts = [i for i, line in enumerate(lines) if line and not line[0].isspace()]
    for start in starts:
        if len(lines) - start <= best_len:
            break
        for end in range(len(lines), start, -1):
            if end - start <= best_len:
                break
            chunk = "\n".join(lines[start:end])
            if chunk.strip() and _parses(chunk):
                best, best_len = chunk, end - start
                break
    return best


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The Python program inside a model output (see the module docstring for the rules)."""
    text = text.replace("\r\n", "\n")
    blocks = [b for b in _fenced_blocks(text) if b.strip()]
    if blocks:
        if entry_point:
            defining = [b for b in blocks if _defines(b, entry_point)]
            if defining:
                return max(defining, key=len)
        valid = [b for b in blocks if _parses(b)]
        if valid:
            return max(valid, key=len)
        return max((_longest_valid_run(b) for b in blocks), key=len)
    if _parses(text):
        return text
    return _longest_valid_run(text)


# ------------------------------------------------------------------------------------------
# dependency-based pruning

_DEF_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_SIMPLE_BODY = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.FunctionDef,
                ast.AsyncFunctionDef, ast.ClassDef, ast.Pass, ast.Expr)


def _assigned_names(node: ast.AST) -> set[str]:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    names = set()
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
    return names


def _is_main_guard(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _compound_definitions(node: ast.AST) -> set[str]:
    """Names bound by a top-level ``try``/``if`` made only of imports and definitions."""
    if not isinstance(node, ast.Try | ast.If) or _is_main_guard(node):
        return set()
    bodies: list[list[ast.stmt]] = [node.body, node.orelse]
    if isinstance(node, ast.Try):
        bodies += [h.body for h in node.handlers] + [node.finalbody]
    names: set[str] = set()
    for body in bodies:
        for stmt in body:
            if not isinstance(stmt, _SIMPLE_BODY):
                return set()
            if isinstance(stmt, ast.Expr) and not isinstance(stmt.value, ast.Constant):
                return set()
            names |= _bound_names(stmt)
    return names


def _is_import_block(node: ast.AST) -> bool:
    """A top-level ``try``/``if`` of imports and fallbacks (kept like a plain import)."""
    return bool(_compound_definitions(node)) and any(
        isinstance(sub, ast.Import | ast.ImportFrom) for sub in ast.walk(node)
    )


def _bound_names(node: ast.AST) -> set[str]:
    if isinstance(node, _DEF_NODES):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        return _assigned_names(node)
    return _compound_definitions(node)


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.Import | ast.ImportFrom):
            names |= _bound_names(node)
    return names


def _used_names(node: ast.AST) -> set[str]:
    return {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}


@dataclasses.dataclass(frozen=True)
class SanitizedProgram:
    """The program to test, and how it was obtained from the model output."""

    program: str  #: sanitised source ("" when nothing usable was found)
    entry_point: str  #: the expected function name
    defined: bool  #: whether ``program`` defines ``entry_point`` (aliased or not)
    aliased_from: str | None = None  #: the function aliased to ``entry_point``, if the alias was used
    reason: str = ""  #: why the program cannot be tested ("" when ``defined``)


def sanitize(
    code: str,
    entry_point: str,
    *,
    alias: bool = True,
    extra_roots: Iterable[str] = (),
) -> SanitizedProgram:
    """Keep ``entry_point`` and its dependencies from ``code`` (already-extracted Python).

    Args:
        code: Python source (use :func:`extract_code` on raw model output first).
        entry_point: the function the tests call.
        alias: apply the alias option when ``entry_point`` is missing.
        extra_roots: further names to keep when defined (e.g. names used by the test code,
            such as a ``Node`` class the MBPP test setup constructs).
    """
    try:
        tree = parse_quietly(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        return SanitizedProgram("", entry_point, False, None, f"no valid Python code: {err}")
    nodes = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    defined = _top_level_names(tree)
    root = entry_point
    aliased_from = None
    if entry_point not in defined:
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        unique = sorted(set(functions))
        if alias and len(unique) == 1:
            root = aliased_from = unique[0]
        else:
            found = ", ".join(unique) if unique else "no functions"
            return SanitizedProgram("", entry_point, False, None,
                                    f"entry point {entry_point!r} not defined (found: {found})")
    providers: dict[str, list[ast.stmt]] = {}
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for name in _bound_names(node):
            providers.setdefault(name, []).append(node)
    wanted = {root} | {n for n in extra_roots if n in defined}
    keep: set[int] = set()
    stack = list(wanted)
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in providers.get(name, []):
            if id(node) not in keep:
                keep.add(id(node))
                stack.extend(_used_names(node) & defined)
    parts = []
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom) or id(node) in keep or _is_import_block(node):
            parts.append(_segment(code, node))
    program = "\n\n".join(parts) + "\n"
    if aliased_from is not None:
        program += f"\n{entry_point} = {aliased_from}\n"
    return SanitizedProgram(program, entry_point, True, aliased_from, "")


def _segment(code: str, node: ast.stmt) -> str:
    """Source text of a top-level statement, decorators included."""
    decorators = getattr(node, "decorator_list", None)
    span: object = node
    if decorators:
        span = types.SimpleNamespace(lineno=min(d.lineno for d in decorators), col_offset=0,
                                     end_lineno=node.end_lineno, end_col_offset=node.end_col_offset)
    return ast.get_source_segment(code, span) or ast.unparse(node)  # type: ignore[arg-type]


def prompt_context(prompt: str, entry_point: str) -> str:
    """The prompt's code minus the entry point's own definition (imports and helpers).

    HumanEval prompts can carry helpers that the tests use (``poly``, ``encode_cyclic``); they
    are placed before every program, as if the program had been appended to the prompt.
    """
    try:
        tree = parse_quietly(prompt)
    except SyntaxError:
        return ""
    parts = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == entry_point:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        parts.append(_segment(prompt, node))
    return "\n\n".join(parts) + ("\n" if parts else "")
