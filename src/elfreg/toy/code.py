"""The ``code`` toy task: one-line Python function-writing problems with hidden tests.

Every example is a dict::

    {"task": "code", "prompt": str, "answer": reference solution, "entry_point": str,
     "tests": [assert statements], "family": str, "level": 1, "key": str}

A problem is a *family* (``add``, ``between``, ``list_above``, ``str_first``, ...) and its integer
or string parameters; ``key`` = ``"family:p0,p1"``. Splits are fixed and disjoint on keys: a key's
split is a hash of the key alone, so a held-out parameter combination never occurs in training
under any wording. The hidden tests of a key are fixed (seeded by the key) and their expected
values come from a plain Python implementation of the family, not from the reference source.

Programs are scored by :func:`score_program` through the evaluation sandbox
(:func:`elfreg.eval.code.execute.run_assert_tests`): generated code runs nowhere else.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from elfreg.eval.code.execute import run_assert_tests

SPLITS = ("train", "valid", "test")
SPLIT_FRACTIONS = (0.7, 0.1, 0.2)

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SUFFIXES = ("!", "?", "ing", "ed", "s", "abc", "xyz", "end", "ok", "42")
_WORDS = ("hello", "python", "banana", "abc", "", "x", "data", "flow", "reasoning", "toy", "zebra")
_ARG_PHRASES = {"x": "a number x", "xs": "a list of numbers xs", "s": "a string s"}


def number_word(n: int) -> str:
    """``3 -> "three"``, ``21 -> "twenty_one"`` (identifier-friendly, 0..99)."""
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + ("" if ones == 0 else "_" + _ONES[ones])


@dataclass(frozen=True)
class _Family:
    name: str
    arg: str
    params: tuple[tuple, ...]
    fn_name: str
    descs: tuple[str, ...]
    expr: str
    impl: Callable


def _r(lo: int, hi: int) -> tuple[tuple[int], ...]:
    return tuple((k,) for k in range(lo, hi + 1))


_FAMILIES = (
    _Family("add", "x", _r(1, 30), "add_{w0}",
            ("returns x plus {p0}", "returns the sum of x and {p0}", "adds {p0} to x and returns the result"),
            "x + {p0}", lambda p, x: x + p[0]),
    _Family("subtract", "x", _r(1, 30), "subtract_{w0}",
            ("returns x minus {p0}", "subtracts {p0} from x and returns the result"),
            "x - {p0}", lambda p, x: x - p[0]),
    _Family("times", "x", _r(2, 12), "times_{w0}",
            ("returns x times {p0}", "returns x multiplied by {p0}"),
            "x * {p0}", lambda p, x: x * p[0]),
    _Family("affine", "x", tuple((a, b) for a in range(2, 10) for b in range(1, 21)), "times_{w0}_plus_{w1}",
            ("returns x times {p0} plus {p1}", "multiplies x by {p0}, adds {p1} and returns the result"),
            "x * {p0} + {p1}", lambda p, x: p[0] * x + p[1]),
    _Family("at_least", "x", _r(0, 30), "at_least_{w0}",
            ("returns the larger of x and {p0}", "returns x, or {p0} when x is smaller than {p0}"),
            "max(x, {p0})", lambda p, x: x if x > p[0] else p[0]),
    _Family("at_most", "x", _r(0, 30), "at_most_{w0}",
            ("returns the smaller of x and {p0}", "returns x, or {p0} when x is larger than {p0}"),
            "min(x, {p0})", lambda p, x: x if x < p[0] else p[0]),
    _Family("between", "x", tuple((a, a + w) for a in range(0, 21) for w in range(1, 11)),
            "between_{w0}_and_{w1}",
            ("returns True if x is between {p0} and {p1} inclusive, otherwise False",
             "checks whether {p0} <= x <= {p1} and returns the result"),
            "{p0} <= x <= {p1}", lambda p, x: x >= p[0] and not x > p[1]),
    _Family("list_add", "xs", _r(1, 20), "add_{w0}_to_each",
            ("returns a new list with {p0} added to every element of xs",
             "adds {p0} to each number in xs and returns the new list"),
            "[v + {p0} for v in xs]", lambda p, xs: list(map(lambda v: v + p[0], xs))),
    _Family("list_times", "xs", _r(2, 12), "multiply_each_by_{w0}",
            ("returns a new list with every element of xs multiplied by {p0}",
             "multiplies each number in xs by {p0} and returns the new list"),
            "[v * {p0} for v in xs]", lambda p, xs: list(map(lambda v: v * p[0], xs))),
    _Family("list_above", "xs", _r(0, 20), "keep_above_{w0}",
            ("returns the elements of xs that are greater than {p0}, in order",
             "keeps only the numbers in xs larger than {p0} and returns them as a list"),
            "[v for v in xs if v > {p0}]", lambda p, xs: list(filter(lambda v: v > p[0], xs))),
    _Family("list_count", "xs", _r(0, 9), "count_{w0}",
            ("returns how many times {p0} appears in xs", "counts the elements of xs equal to {p0}"),
            "xs.count({p0})", lambda p, xs: sum(1 for v in xs if v == p[0])),
    _Family("str_repeat", "s", _r(2, 9), "repeat_{w0}_times",
            ("returns the string s repeated {p0} times", "returns {p0} copies of s joined together"),
            "s * {p0}", lambda p, s: "".join([s] * p[0])),
    _Family("str_first", "s", _r(1, 9), "first_{w0}_chars",
            ("returns the first {p0} characters of s", "returns s cut after its first {p0} characters"),
            "s[:{p0}]", lambda p, s: "".join(s[i] for i in range(min(p[0], len(s))))),
    _Family("str_drop", "s", _r(1, 9), "drop_first_{w0}",
            ("returns s without its first {p0} characters", "removes the first {p0} characters of s"),
            "s[{p0}:]", lambda p, s: "".join(s[i] for i in range(p[0], len(s)))),
    _Family("str_suffix", "s", tuple((w,) for w in _SUFFIXES), "append_{w0}",
            ("returns s followed by the text {q0}", "appends {q0} to s and returns the result"),
            "s + {q0}", lambda p, s: f"{s}{p[0]}"),
)
FAMILIES: dict[str, _Family] = {f.name: f for f in _FAMILIES}

_PROMPTS = (
    "Write a function {sig} that {desc}.",
    "Define a Python function {sig} which {desc}.",
    "Implement {sig}: it {desc}.",
    "Create a function named {name} that takes {argp} and {desc}.",
)


def _fields(params: tuple) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, p in enumerate(params):
        out[f"p{i}"] = str(p)
        out[f"q{i}"] = repr(p)
        if isinstance(p, int):
            out[f"w{i}"] = number_word(p)
        else:
            out[f"w{i}"] = {"!": "bang", "?": "question_mark"}.get(p, p)
    return out


def key_of(family: str, params: tuple) -> str:
    """Combination key ``"family:p0,p1"``."""
    return f"{family}:" + ",".join(str(p) for p in params)


def split_of(key: str) -> str:
    """The split a key belongs to: a pure hash of the key (70 / 10 / 20 %)."""
    u = int.from_bytes(hashlib.sha256(f"elfreg-code|{key}".encode()).digest()[:8], "big") / 2**64
    if u < SPLIT_FRACTIONS[0]:
        return "train"
    return "valid" if u < SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1] else "test"


def _test_inputs(arg: str, params: tuple, rng: random.Random, n: int) -> list:
    """Boundary inputs around each integer parameter first, then random ones (no duplicates)."""
    ints = [p for p in params if isinstance(p, int)]
    if arg == "x":
        fixed: list = [v for p in ints for v in (p - 1, p, p + 1)]
    elif arg == "xs":
        fixed = [[p + 1, p, p - 1, p + 2] for p in ints[:1]] + [[]]
    else:
        fixed = ["abcdefghijklmnop", "hi"]
    out: list = []
    for value in fixed:
        if value not in out:
            out.append(value)
    target = max(n, len(out) + 2)
    for _ in range(100):
        if len(out) >= target:
            break
        if arg == "x":
            value = rng.randint(-10, 60)
        elif arg == "xs":
            value = [rng.randint(0, 25) for _ in range(rng.randint(1, 6))]
            if ints and rng.random() < 0.5:
                value[rng.randrange(len(value))] = ints[0]
        else:
            value = rng.choice(_WORDS)
        if value not in out:
            out.append(value)
    return out


def hidden_tests(family: str, params: tuple, n: int = 5) -> list[str]:
    """The fixed ``assert`` lines of a key; expected values from the family's Python model.

    Inputs: the values around each integer parameter (so that a neighbouring parameter fails),
    then random ones, at least ``n`` in all.
    """
    fam = FAMILIES[family]
    name = fam.fn_name.format(**_fields(params))
    rng = random.Random(f"elfreg-code-tests|{key_of(family, params)}")
    return [f"assert {name}({value!r}) == {fam.impl(params, value)!r}"
            for value in _test_inputs(fam.arg, params, rng, n)]


def make_problem(family: str, params: tuple, rng: random.Random) -> dict:
    """One problem for ``(family, params)`` with a wording drawn from ``rng``."""
    fam = FAMILIES[family]
    f = _fields(params)
    name = fam.fn_name.format(**f)
    sig = f"{name}({fam.arg})"
    desc = rng.choice(fam.descs).format(**f)
    prompt = rng.choice(_PROMPTS).format(sig=sig, name=name, desc=desc, argp=_ARG_PHRASES[fam.arg])
    solution = f"def {sig}:\n    return {fam.expr.format(**f)}"
    return {"task": "code", "prompt": prompt, "answer": solution, "entry_point": name,
            "tests": hidden_tests(family, params), "family": family, "level": 1,
            "key": key_of(family, params)}


def combinations() -> list[tuple[str, tuple]]:
    """Every ``(family, params)`` combination."""
    return [(f.name, p) for f in _FAMILIES for p in f.params]


def heldout(split: str, seed: int = 0) -> list[dict]:
    """Every combination of a held-out split (``valid``/``test``), one wording each."""
    if split not in ("valid", "test"):
        raise ValueError(f"held-out split must be 'valid' or 'test', got {split!r}")
    return [make_problem(fam, p, random.Random(f"code-heldout|{seed}|{key_of(fam, p)}"))
            for fam, p in combinations() if split_of(key_of(fam, p)) == split]


def sample(split: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` random problems of ``split``: a family uniformly, then one of its keys in the split."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    by_family: dict[str, list[tuple]] = {}
    for fam, p in combinations():
        if split_of(key_of(fam, p)) == split:
            by_family.setdefault(fam, []).append(p)
    names = sorted(by_family)
    rng = random.Random(f"code-sample|{seed}|{split}")
    out = []
    for _ in range(n):
        fam = rng.choice(names)
        out.append(make_problem(fam, rng.choice(by_family[fam]), rng))
    return out


def split_sizes() -> dict[str, int]:
    """Number of keys (= problems in a held-out split) per split."""
    sizes = dict.fromkeys(SPLITS, 0)
    for fam, p in combinations():
        sizes[split_of(key_of(fam, p))] += 1
    return sizes


def score_program(example: dict, program: str, timeout: float = 5.0) -> bool:
    """Whether ``program`` passes the hidden tests of a code ``example``.

    The program runs as written (not sanitised) followed by the example's ``assert`` lines, in
    the evaluation sandbox, within ``timeout`` seconds; a timeout or a crash is a failure.
    """
    return run_assert_tests(program, example["tests"], timeout=timeout).passed
