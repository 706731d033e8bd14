"""The ``arith`` toy task: GSM-style addition/subtraction word problems with short rationales.

Every example is a dict::

    {"task": "arith", "prompt": str, "answer": rationale + "\\n#### N", "final": "N",
     "level": 1 | 2, "key": str}

``answer`` follows GSM8K's format: one short line per arithmetic step, each containing the
equation ``x op y = z``, then a final line ``#### N``. Answers are computed while the problem is
built, so they are correct by construction (``verify_example`` re-checks them independently).

Level 1 is one step (``a + b`` or ``a - b``); level 2 chains two or three steps. Operands lie in
``1..max_number``; level-2 running totals stay in ``1..max_value``; no answer is ever negative
or zero.

Splits are fixed and disjoint on *number combinations*: the ``key`` of an example is the list of
its equations (``"12+7"``, ``"12+7,19-5"``), with the two operands of a level-1 addition sorted so
that ``a + b`` and ``b + a`` share a key. A key's split is a deterministic hash of the key alone
(not of the seed or the wording), so a held-out combination never occurs in training under any
wording. Moreover every step of a training chain is itself a training combination, so a
held-out one-step combination never appears in training even inside a level-2 chain (see
``in_split``); held-out chains may use training steps (they test composition). Level-1
held-out splits enumerate every ordered combination of their keys, one wording each; level-2
held-out splits draw ``level2_heldout_size`` distinct keys. Seeds only choose wordings and
samples.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass

from elfreg.eval.tasks.gsm8k import extract_gsm8k_answer, numbers_equal

SPLITS = ("train", "valid", "test")

_NAMES = (
    ("Mia", "she"), ("Tom", "he"), ("Ava", "she"), ("Leo", "he"), ("Zoe", "she"), ("Sam", "he"),
    ("Lily", "she"), ("Ben", "he"), ("Emma", "she"), ("Max", "he"), ("Nora", "she"), ("Jack", "he"),
)
_OBJECTS = (
    ("apple", "apples"), ("marble", "marbles"), ("book", "books"), ("pencil", "pencils"),
    ("sticker", "stickers"), ("cookie", "cookies"), ("shell", "shells"), ("coin", "coins"),
    ("card", "cards"), ("toy car", "toy cars"), ("flower", "flowers"), ("egg", "eggs"),
)
_PLACES = ("basket", "box", "jar", "bag", "drawer", "bowl")
GAIN_VERBS = ("buys", "finds", "gets", "picks up", "wins", "is given")
LOSS_VERBS = ("gives away", "sells", "loses", "uses", "trades away", "drops")
_PUT_VERBS = ("puts", "adds", "places")
_TAKE_VERBS = ("takes", "removes", "pulls")

_EQ_RE = re.compile(r"(\d+) ([+-]) (\d+) = (\d+)")
_NUMBER_RE = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ArithConfig:
    """Settings of the arith task (all part of the toy-asset cache key)."""

    max_number: int = 30
    """Operands are drawn from ``1..max_number`` (at least 20, at most 99)."""
    max_value: int | None = None
    """Level-2 running totals stay in ``1..max_value``; default ``max(99, 2 * max_number)``."""
    split_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)
    """Share of number combinations (keys) in train / valid / test."""
    level2_heldout_size: int = 300
    """Number of distinct level-2 problems in each held-out split."""

    def __post_init__(self) -> None:
        if not 2 <= self.max_number <= 99:
            raise ValueError(f"max_number must be in 2..99, got {self.max_number}")
        if self.max_value is None:
            object.__setattr__(self, "max_value", max(99, 2 * self.max_number))
        if self.max_value < 2 * self.max_number:
            raise ValueError("max_value must be at least 2 * max_number")
        if len(self.split_fractions) != 3 or abs(sum(self.split_fractions) - 1.0) > 1e-9:
            raise ValueError(f"split_fractions must be three shares summing to 1, got {self.split_fractions}")


def _noun(n: int, obj: tuple[str, str]) -> str:
    return f"{n} {obj[0] if n == 1 else obj[1]}"


def _unit(n: int, obj: tuple[str, str]) -> str:
    return obj[0] if n == 1 else obj[1]


def _eq(x: int, op: str, y: int) -> tuple[str, int]:
    z = x + y if op == "+" else x - y
    return f"{x} {op} {y} = {z}", z


def key_of(equations: list[tuple[int, str, int]]) -> str:
    """Combination key of a list of ``(x, op, y)`` steps; a lone addition has sorted operands."""
    if len(equations) == 1 and equations[0][1] == "+":
        x, _, y = equations[0]
        x, y = min(x, y), max(x, y)
        return f"{x}+{y}"
    return ",".join(f"{x}{op}{y}" for x, op, y in equations)


def split_of(key: str, cfg: ArithConfig | None = None) -> str:
    """The split (``train``/``valid``/``test``) a combination key belongs to; a pure hash of the key."""
    cfg = cfg or ArithConfig()
    u = int.from_bytes(hashlib.sha256(f"elfreg-arith|{key}".encode()).digest()[:8], "big") / 2**64
    if u < cfg.split_fractions[0]:
        return "train"
    if u < cfg.split_fractions[0] + cfg.split_fractions[1]:
        return "valid"
    return "test"


def step_keys(key: str) -> list[str]:
    """The one-step keys of every step of a combination key (``"12+7,19-5"`` -> ``["7+12", "19-5"]``)."""
    return [key_of([(int(x), op, int(y))]) for x, op, y in re.findall(r"(\d+)([+-])(\d+)", key)]


def in_split(key: str, split: str, cfg: ArithConfig | None = None) -> bool:
    """Whether a problem with combination ``key`` may appear in ``split``.

    Its key must hash to ``split``; a *training* problem must moreover contain only training
    steps, so that no held-out one-step combination is ever seen in training, not even as a step
    of a chain. (Held-out chains may contain training steps: they test composition.)
    """
    if split_of(key, cfg) != split:
        return False
    return split != "train" or all(split_of(k, cfg) == "train" for k in step_keys(key))


def level1_combinations(cfg: ArithConfig | None = None) -> list[tuple[int, str, int]]:
    """All ordered one-step combinations: ``a + b`` for any operands, ``a - b`` for ``a > b``."""
    cfg = cfg or ArithConfig()
    rng = range(1, cfg.max_number + 1)
    adds = [(a, "+", b) for a in rng for b in rng]
    subs = [(a, "-", b) for a in rng for b in rng if a > b]
    return adds + subs


def _answer(lines: list[str], final: int) -> str:
    return "\n".join(lines) + f"\n#### {final}"


def _record(prompt: str, lines: list[str], final: int, level: int, steps: list[tuple[int, str, int]]) -> dict:
    return {"task": "arith", "prompt": prompt, "answer": _answer(lines, final), "final": str(final),
            "level": level, "key": key_of(steps)}


def make_level1(a: int, op: str, b: int, rng: random.Random) -> dict:
    """One one-step problem for ``a op b`` with a wording drawn from ``rng``."""
    (n1, p1), (n2, _) = rng.sample(_NAMES, 2)
    obj = rng.choice(_OBJECTS)
    place = rng.choice(_PLACES)
    eq, c = _eq(a, op, b)
    style = rng.randrange(3)
    if op == "+":
        if style == 0:
            prompt = (f"{n1} has {_noun(a, obj)}. {n2} has {_noun(b, obj)}. "
                      f"How many {obj[1]} do they have together?")
            line = f"Together they have {eq} {_unit(c, obj)}."
        elif style == 1:
            verb = rng.choice(GAIN_VERBS)
            prompt = (f"{n1} has {_noun(a, obj)}. {p1.capitalize()} {verb} {b} more. "
                      f"How many {obj[1]} does {n1} have now?")
            line = f"{n1} has {eq} {_unit(c, obj)} now."
        else:
            verb = rng.choice(_PUT_VERBS)
            prompt = (f"There are {_noun(a, obj)} in the {place}. {n1} {verb} {b} more in the {place}. "
                      f"How many {obj[1]} are in the {place} now?")
            line = f"The {place} has {eq} {_unit(c, obj)} now."
    else:
        if style == 0:
            prompt = (f"{n1} has {_noun(a, obj)}. {n2} has {_noun(b, obj)}. "
                      f"How many more {obj[1]} does {n1} have than {n2}?")
            line = f"{n1} has {eq} more {_unit(c, obj)}."
        elif style == 1:
            verb = rng.choice(LOSS_VERBS)
            prompt = (f"{n1} has {_noun(a, obj)}. {p1.capitalize()} {verb} {b} of them. "
                      f"How many {obj[1]} does {n1} have left?")
            line = f"{n1} has {eq} {_unit(c, obj)} left."
        else:
            verb = rng.choice(_TAKE_VERBS)
            prompt = (f"There are {_noun(a, obj)} in the {place}. {n1} {verb} {b} of them. "
                      f"How many {obj[1]} are left in the {place}?")
            line = f"The {place} has {eq} {_unit(c, obj)} left."
    return _record(prompt, [line], c, 1, [(a, op, b)])


def _random_chain(rng: random.Random, cfg: ArithConfig) -> tuple[int, list[tuple[str, int]]]:
    """A start value and 2-3 (op, n) steps keeping every running total in 1..max_value."""
    start = rng.randint(1, cfg.max_number)
    cur, steps = start, []
    for _ in range(rng.choice((2, 3))):
        op = rng.choice("+-")
        if op == "-" and cur < 2:
            op = "+"
        if op == "+" and cur + 1 > cfg.max_value:
            op = "-"
        n = rng.randint(1, min(cfg.max_number, cfg.max_value - cur)) if op == "+" else \
            rng.randint(1, min(cfg.max_number, cur - 1))
        cur = cur + n if op == "+" else cur - n
        steps.append((op, n))
    return start, steps


def make_level2(rng: random.Random, cfg: ArithConfig | None = None) -> dict:
    """One multi-step problem: a 2-3 event chain, or a "more/fewer than, then together" pair."""
    cfg = cfg or ArithConfig()
    (n1, p1), (n2, p2) = rng.sample(_NAMES, 2)
    obj = rng.choice(_OBJECTS)
    place = rng.choice(_PLACES)
    style = rng.randrange(3)
    if style == 2:  # B has b more/fewer than A; how many together?
        a = rng.randint(2, cfg.max_number)
        op = rng.choice("+-") if 2 * a < cfg.max_value else "-"
        b = rng.randint(1, min(cfg.max_number, cfg.max_value - 2 * a)) if op == "+" else rng.randint(1, a - 1)
        eq1, c = _eq(a, op, b)
        eq2, d = _eq(a, "+", c)
        word = "more" if op == "+" else "fewer"
        prompt = (f"{n1} has {_noun(a, obj)}. {n2} has {b} {word} {obj[1]} than {n1}. "
                  f"How many {obj[1]} do they have together?")
        lines = [f"{n2} has {eq1} {_unit(c, obj)}.", f"Together they have {eq2} {_unit(d, obj)}."]
        return _record(prompt, lines, d, 2, [(a, op, b), (a, "+", c)])
    start, steps = _random_chain(rng, cfg)
    sentences, lines, equations = [], [], []
    cur = start
    for i, (op, n) in enumerate(steps):
        eq, nxt = _eq(cur, op, n)
        equations.append((cur, op, n))
        lead = "Then " if i else ""
        if style == 0:
            if op == "+":
                act = f"{rng.choice(GAIN_VERBS)} {n} more"
            else:
                act = f"{rng.choice(LOSS_VERBS)} {n} of them"
            sentences.append(f"{lead}{p1 if i else p1.capitalize()} {act}.")
            lines.append(f"{n1 if not i else 'Then ' + p1} has {eq} {_unit(nxt, obj)}.")
        else:
            verb = rng.choice(_PUT_VERBS if op == "+" else _TAKE_VERBS)
            who = rng.choice((n1, n2))
            tail = f"{n} more" if op == "+" else f"{n} of them"
            sentences.append(f"{lead}{who} {verb} {tail}.")
            lines.append(f"{'The ' + place if not i else 'Then it'} has {eq} {_unit(nxt, obj)}.")
        cur = nxt
    if style == 0:
        prompt = f"{n1} has {_noun(start, obj)}. " + " ".join(sentences) + \
            f" How many {obj[1]} does {n1} have now?"
    else:
        prompt = f"There are {_noun(start, obj)} in the {place}. " + " ".join(sentences) + \
            f" How many {obj[1]} are in the {place} now?"
    return _record(prompt, lines, cur, 2, equations)


def _seeded(*parts: object) -> random.Random:
    return random.Random("|".join(str(p) for p in parts))


def heldout(split: str, level: int, cfg: ArithConfig | None = None, seed: int = 0) -> list[dict]:
    """The fixed held-out set of ``split`` (``valid``/``test``) at ``level``.

    Level 1: every ordered combination whose key is in ``split``, one wording each. Level 2:
    ``cfg.level2_heldout_size`` problems with distinct keys in ``split``.
    """
    cfg = cfg or ArithConfig()
    if split not in ("valid", "test"):
        raise ValueError(f"held-out split must be 'valid' or 'test', got {split!r}")
    if level == 1:
        out = []
        for a, op, b in level1_combinations(cfg):
            if split_of(key_of([(a, op, b)]), cfg) == split:
                out.append(make_level1(a, op, b, _seeded("arith-l1", seed, split, a, op, b)))
        return out
    if level == 2:
        rng, out, seen = _seeded("arith-l2", seed, split), [], set()
        while len(out) < cfg.level2_heldout_size:
            ex = make_level2(rng, cfg)
            if ex["key"] not in seen and split_of(ex["key"], cfg) == split:
                seen.add(ex["key"])
                out.append(ex)
        return out
    raise ValueError(f"level must be 1 or 2, got {level}")


def sample_mixed(split: str, n: int, level1_share: float, seed: int = 0, cfg: ArithConfig | None = None,
                 balance: str = "combination") -> list[dict]:
    """``n`` problems of ``split``: ``round(n * level1_share)`` one-step problems (drawn as
    ``balance`` says) and chains for the rest, in a seeded random order, so any prefix of the
    list holds both kinds in about that share. Each kind is what :func:`sample` draws for its
    level and the same seed."""
    if not 0 <= level1_share < 1:
        raise ValueError(f"level1_share must be in [0, 1), got {level1_share}")
    ones = round(n * level1_share)
    out = sample(split, 1, ones, seed, cfg, balance) + sample(split, 2, n - ones, seed, cfg)
    _seeded("arith-mix", seed, split).shuffle(out)
    return out


BALANCES = ("combination", "tens")
"""How :func:`sample` draws one-step combinations: each equally often (``combination``), or each
tens digit of the result equally often, every combination equally often within its digit
(``tens``)."""


def tens_group(result: int, cfg: ArithConfig) -> int:
    """The tens digit of a one-step result, the largest result (``2 * max_number``, a lone
    combination when it is a round number) counted with the digit below it."""
    return min(result, 2 * cfg.max_number - 1) // 10


def tens_balanced_weights(combos: list[tuple[int, str, int]], cfg: ArithConfig) -> list[float]:
    """Draw weights of one-step ``combos`` that give every tens digit of the result the same share:
    ``1 / (number of combos with that digit)``. Uniform over combinations, the digits are far from
    equal (with operands up to 30, a training result lies in the 50s for 4.4 % of combinations and
    in the 10s for 22 %), and a student learns the rare high digits last."""
    groups = [tens_group(_eq(a, op, b)[1], cfg) for a, op, b in combos]
    counts = Counter(groups)
    return [1.0 / counts[g] for g in groups]


def sample(split: str, level: int, n: int, seed: int = 0, cfg: ArithConfig | None = None,
           balance: str = "combination") -> list[dict]:
    """``n`` random problems of ``split`` at ``level`` (keys may repeat; wordings vary); one-step
    combinations drawn as ``balance`` says (:data:`BALANCES`; level 2 draws chains only one way)."""
    cfg = cfg or ArithConfig()
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
    if balance != "combination" and level != 1:
        raise ValueError(f"balance {balance!r} applies to one-step problems (level 1), not level {level}")
    rng = _seeded("arith-sample", seed, split, level)
    out: list[dict] = []
    if level == 1:
        combos = [c for c in level1_combinations(cfg) if split_of(key_of([c]), cfg) == split]
        if balance == "tens":
            weights = tens_balanced_weights(combos, cfg)
            draws = rng.choices(combos, weights, k=n)
            return [make_level1(*c, rng) for c in draws]
        for _ in range(n):
            out.append(make_level1(*rng.choice(combos), rng))
        return out
    if level == 2:
        while len(out) < n:
            ex = make_level2(rng, cfg)
            if in_split(ex["key"], split, cfg):
                out.append(ex)
        return out
    raise ValueError(f"level must be 1 or 2, got {level}")


def final_answer(text: str) -> str | None:
    """The final number of a rationale, read as the GSM8K scorer reads it: the one extractor of
    the toy task, for training answers, the student's samples and the frozen LMs' outputs alike."""
    return extract_gsm8k_answer(text)


def is_correct(text: str, problem: dict) -> bool:
    """Whether ``text`` ends in the problem's final answer (numerically equal)."""
    return numbers_equal(final_answer(text), problem["final"])


ERROR_KINDS = ("no answer", "wrong operands", "off by one", "off by ten", "final disagrees", "other")
"""What went wrong in a wrong answer of a one-step problem, in the order :func:`error_kind` tests."""


def error_kind(text: str, problem: dict) -> str | None:
    """None if ``text`` answers ``problem`` (level 1) correctly, else the first of
    :data:`ERROR_KINDS` that fits: no final number; the rationale's equation does not restate the
    problem's operation; the final answer is 1 or 10 away from the gold one (a units or a tens
    digit one step off, the usual slip of a student that computes on a number line); the
    equation's result is right but the ``#### N`` line says another number; anything else."""
    if is_correct(text, problem):
        return None
    final = final_answer(text)
    if final is None:
        return "no answer"
    equation = _EQ_RE.search(text)
    if equation is None or key_of([(int(equation[1]), equation[2], int(equation[3]))]) != problem["key"]:
        return "wrong operands"
    miss = abs(float(final) - float(problem["final"]))
    if miss in (1, 10):
        return "off by one" if miss == 1 else "off by ten"
    if numbers_equal(equation[4], problem["final"]):
        return "final disagrees"
    return "other"


def verify_example(ex: dict) -> list[str]:
    """Independent re-check of an example; returns a list of problems (empty when correct).

    Checks that every rationale equation holds, that each operand is a number of the prompt or
    an earlier result, that every prompt number is used, that the ``#### N`` line, ``final`` and
    the last result agree, and that ``key`` matches the equations.
    """
    errors: list[str] = []
    *body, last = ex["answer"].split("\n")
    m = re.fullmatch(r"#### (\d+)", last)
    if not m:
        return [f"last line is not '#### N': {last!r}"]
    eqs = [tuple(_EQ_RE.search(line).groups()) if _EQ_RE.search(line) else None for line in body]
    if not eqs or None in eqs:
        return ["every rationale line must hold one equation"]
    prompt_nums = [int(x) for x in _NUMBER_RE.findall(ex["prompt"])]
    known, steps = set(prompt_nums), []
    for x, op, y, z in eqs:
        x, y, z = int(x), int(y), int(z)
        true = x + y if op == "+" else x - y
        if true != z:
            errors.append(f"{x} {op} {y} != {z}")
        if x not in known or y not in known:
            errors.append(f"operand of {x} {op} {y} comes from nowhere")
        if z < 0:
            errors.append("negative intermediate result")
        known.add(z)
        steps.append((x, op, y))
    used = {v for s in steps for v in (s[0], s[2])}
    if not set(prompt_nums) <= used:
        errors.append("a prompt number is unused")
    if int(m.group(1)) != int(eqs[-1][3]) or ex["final"] != m.group(1):
        errors.append("final answer disagrees with the last step")
    if ex["key"] != key_of(steps):
        errors.append("key does not match the equations")
    return errors


def split_sizes(cfg: ArithConfig | None = None) -> dict[str, dict[str, int]]:
    """Level-1 key and problem counts per split (level-2 held-out sizes are fixed by config)."""
    cfg = cfg or ArithConfig()
    sizes = {s: {"keys": 0, "problems": 0} for s in SPLITS}
    keys: dict[str, str] = {}
    for combo in level1_combinations(cfg):
        k = key_of([combo])
        s = keys.setdefault(k, split_of(k, cfg))
        sizes[s]["problems"] += 1
    for s in keys.values():
        sizes[s]["keys"] += 1
    return sizes
