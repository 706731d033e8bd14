"""Code extraction, dependency-based sanitising and the alias option."""

from __future__ import annotations

import ast

from elfreg.eval import extract_code, sanitize
from elfreg.eval.code.sanitize import prompt_context

CHATTY = '''Sure! Here is the solution:

```python
import math
from functools import lru_cache

MOD = 10**9 + 7
UNUSED = 5

class Box:
    def __init__(self, v):
        self.v = helper(v)

def helper(x):
    return x * MOD

def unrelated():
    return 1

@lru_cache(None)
def solve(n):
    """doc"""
    return Box(n).v + math.floor(1.5)

print(solve(3))
assert solve(1) == 1

if __name__ == "__main__":
    print("hi")
```

And an example:
```python
print(solve(2))
```
'''


def _top_names(program: str) -> set[str]:
    tree = ast.parse(program)
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_keeps_target_and_transitive_dependencies_only() -> None:
    code = extract_code(CHATTY, "solve")
    assert "def solve" in code and "print(solve(2))" not in code  # the defining block was chosen
    result = sanitize(code, "solve")
    assert result.defined and result.aliased_from is None
    assert _top_names(result.program) == {"MOD", "Box", "helper", "solve"}
    assert "import math" in result.program and "from functools import lru_cache" in result.program
    assert "@lru_cache(None)" in result.program  # decorators are kept
    for dropped in ("print(", "assert ", "__main__", "UNUSED", "unrelated"):
        assert dropped not in result.program
    namespace: dict = {}
    exec(result.program, namespace)
    assert namespace["solve"](2) == 2 * (10**9 + 7) + 1


def test_alias_single_function_only() -> None:
    one = sanitize("def only(x):\n    return x + 1\n\nprint(only(1))\n", "answer")
    assert one.defined and one.aliased_from == "only"
    namespace: dict = {}
    exec(one.program, namespace)
    assert namespace["answer"](1) == 2
    off = sanitize("def only(x):\n    return x\n", "answer", alias=False)
    assert not off.defined and "not defined" in off.reason
    two = sanitize("def a():\n    pass\n\ndef b():\n    pass\n", "answer")
    assert not two.defined and "a, b" in two.reason


def test_extra_roots_keep_what_tests_use() -> None:
    code = "class Node:\n    def __init__(self, v):\n        self.v = v\n\ndef depth(root):\n    return 1\n"
    without = sanitize(code, "depth")
    assert "class Node" not in without.program
    with_roots = sanitize(code, "depth", extra_roots={"Node", "assert", "not_defined_anywhere"})
    assert "class Node" in with_roots.program


def test_prose_and_truncation_without_fences() -> None:
    assert extract_code("Here you go\ndef f(x):\n    return x+1\nThis adds one.\n", "f").strip() == (
        "def f(x):\n    return x+1"
    )
    truncated = extract_code("def f(x):\n    return x+1\n\ndef g(", "f")
    assert truncated.startswith("def f(x):") and "def g(" not in truncated
    unterminated = extract_code("text\n```python\ndef f():\n    return 3\n", "f")
    assert unterminated.strip() == "def f():\n    return 3"


def test_invalid_code_is_reported() -> None:
    result = sanitize("def (:\n", "f")
    assert not result.defined and result.program == "" and "no valid Python" in result.reason
    assert extract_code("just words, no code at all", "f") == ""


def test_conditional_imports_and_globals_survive() -> None:
    code = (
        "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n\n"
        "TABLE = {1: 'a'}\n\ndef f(k):\n    return TABLE[k]\n"
    )
    result = sanitize(code, "f")
    assert "try:" in result.program and "TABLE = {1: 'a'}" in result.program


def test_prompt_context_keeps_helpers_not_entry_point() -> None:
    prompt = 'import math\n\n\ndef poly(xs, x):\n    return 0\n\n\ndef find_zero(xs):\n    """doc"""\n'
    context = prompt_context(prompt, "find_zero")
    assert "import math" in context and "def poly" in context and "find_zero" not in context
