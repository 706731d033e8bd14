"""The arith toy task: answers correct by construction, fixed disjoint splits, short rationales."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from elfreg.toy import arith as A

CFG = A.ArithConfig()

# An independent reading of the prompt: a start quantity, then events that add or remove.
_GAIN_CUES = ("more", "buys", "finds", "gets", "picks up", "wins", "is given", "puts", "adds", "places")
_LOSS_CUES = ("of them",)


def _solve_from_prompt(prompt: str) -> int:
    """Answer a generated prompt from its words alone (no access to the generator's templates)."""
    sentences = [s.strip() for s in re.split(r"(?<=[.?])\s", prompt) if s.strip()]
    question = sentences[-1]
    facts = [(s, [int(x) for x in re.findall(r"\d+", s)]) for s in sentences[:-1]]
    if "more" in question and "than" in question:  # "How many more X does A have than B?"
        return facts[0][1][0] - facts[1][1][0]
    if "than" in facts[-1][0]:  # "B has n more/fewer X than A. ... together?"
        a, n = facts[0][1][0], facts[1][1][0]
        b = a + n if " more " in facts[1][0] else a - n
        return a + b
    if "together" in question:
        return facts[0][1][0] + facts[1][1][0]
    total = facts[0][1][0]
    for text, nums in facts[1:]:
        if any(c in text for c in _LOSS_CUES):
            total -= nums[0]
        elif any(c in text for c in _GAIN_CUES):
            total += nums[0]
        else:
            raise AssertionError(f"unreadable event: {text!r}")
    return total


@pytest.mark.parametrize("level", [1, 2])
def test_answers_correct_by_construction(level: int) -> None:
    examples = A.sample("train", level, 400, seed=3) + A.heldout("test", level, CFG)
    for ex in examples:
        assert A.verify_example(ex) == [], ex
        assert str(_solve_from_prompt(ex["prompt"])) == ex["final"], ex
        assert ex["answer"].endswith(f"\n#### {ex['final']}")
        assert int(ex["final"]) >= 1 and ex["level"] == level
        n_eq = ex["answer"].count(" = ")
        assert n_eq == 1 if level == 1 else n_eq in (2, 3)


def test_verify_example_catches_wrong_answers() -> None:
    ex = A.make_level1(12, "+", 7, random.Random(0))
    assert A.verify_example(ex) == []
    wrong_sum = {**ex, "answer": ex["answer"].replace("= 19", "= 18").replace("#### 19", "#### 18"),
                 "final": "18"}
    assert A.verify_example(wrong_sum)
    wrong_final = {**ex, "answer": ex["answer"].replace("#### 19", "#### 20"), "final": "20"}
    assert A.verify_example(wrong_final)
    assert A.verify_example({**ex, "key": "7-12"})


def test_key_ignores_addition_order_and_wording() -> None:
    rng = random.Random(0)
    a = A.make_level1(12, "+", 7, rng)
    b = A.make_level1(7, "+", 12, rng)
    assert a["key"] == b["key"] == "7+12"
    assert A.make_level1(12, "-", 7, rng)["key"] == "12-7"


def test_splits_disjoint_on_combinations_and_prompts() -> None:
    train = A.sample("train", 1, 3000, seed=0) + A.sample("train", 2, 3000, seed=0)
    train_keys = {e["key"] for e in train}
    train_prompts = {e["prompt"] for e in train}
    seen_eval: set[str] = set()
    for split in ("valid", "test"):
        for level in (1, 2):
            held = A.heldout(split, level, CFG)
            keys = {e["key"] for e in held}
            assert all(A.split_of(k, CFG) == split for k in keys)
            assert not keys & train_keys
            assert not {e["prompt"] for e in held} & train_prompts
            assert not keys & seen_eval
            seen_eval |= keys
    # The split of a combination is a property of the key, not of the seed or the wording.
    assert {A.split_of(e["key"], CFG) for e in train} == {"train"}
    # No held-out one-step combination appears in training, not even as a step of a chain.
    train_steps = {k for e in train for k in A.step_keys(e["key"])}
    assert any("," in e["key"] for e in train) and len(train_steps) > len(train_keys & train_steps)
    held_l1 = {e["key"] for s in ("valid", "test") for e in A.heldout(s, 1, CFG)}
    assert not train_steps & held_l1
    assert {A.split_of(k, CFG) for k in train_steps} == {"train"}


def test_split_sizes_as_documented() -> None:
    sizes = A.split_sizes(CFG)
    assert sizes == {"train": {"keys": 632, "problems": 931}, "valid": {"keys": 84, "problems": 127},
                     "test": {"keys": 184, "problems": 277}}
    assert len(A.level1_combinations(CFG)) == 30 * 30 + 30 * 29 // 2
    assert len(A.heldout("test", 1, CFG)) == 277 >= 200
    assert len(A.heldout("valid", 1, CFG)) == 127
    held2 = A.heldout("test", 2, CFG)
    assert len(held2) == CFG.level2_heldout_size == len({e["key"] for e in held2})


def test_deterministic_for_a_seed() -> None:
    assert A.sample("train", 2, 50, seed=5) == A.sample("train", 2, 50, seed=5)
    assert A.sample("train", 2, 50, seed=5) != A.sample("train", 2, 50, seed=6)
    assert A.heldout("test", 1, CFG) == A.heldout("test", 1, CFG)
    # Another seed rewords the held-out set but keeps its combinations.
    other = A.heldout("test", 1, CFG, seed=1)
    assert [e["key"] for e in other] == [e["key"] for e in A.heldout("test", 1, CFG)]
    assert [e["prompt"] for e in other] != [e["prompt"] for e in A.heldout("test", 1, CFG)]


def _tens_shares(exs: list[dict]) -> dict[int, float]:
    groups = Counter(A.tens_group(int(e["final"]), CFG) for e in exs)
    return {g: groups[g] / len(exs) for g in sorted(groups)}


def test_tens_balance_evens_the_result_digits_and_stays_in_split() -> None:
    uniform = A.sample("train", 1, 6000, seed=0, cfg=CFG)
    balanced = A.sample("train", 1, 6000, seed=0, cfg=CFG, balance="tens")
    # Uniform over combinations the 50s are rare (41 of 931 training combinations, 60 included);
    # balanced, each of the six digits holds a sixth of the draws.
    assert _tens_shares(uniform)[5] < 0.06
    assert all(abs(share - 1 / 6) < 0.02 for share in _tens_shares(balanced).values())
    assert len(_tens_shares(balanced)) == 6
    # Every draw is a training combination (never a held-out one) with a correct answer.
    test_keys = {e["key"] for e in A.heldout("test", 1, CFG)}
    assert all(A.split_of(e["key"], CFG) == "train" and e["key"] not in test_keys for e in balanced)
    assert all(A.verify_example(e) == [] for e in balanced[:500])
    # The lone 60 (30 + 30) joins the 50s; a seed gives the same draws.
    assert A.tens_group(60, CFG) == A.tens_group(59, CFG) == 5 and A.tens_group(9, CFG) == 0
    assert A.sample("train", 1, 50, seed=3, cfg=CFG, balance="tens") == \
        A.sample("train", 1, 50, seed=3, cfg=CFG, balance="tens")


def test_tens_balanced_weights_are_inverse_digit_counts() -> None:
    combos = [(1, "+", 2), (3, "+", 4), (5, "+", 9), (20, "+", 21), (30, "-", 1)]
    weights = A.tens_balanced_weights(combos, CFG)
    # digits 0, 0, 1, 4, 2: the two 0s share their digit's weight
    assert weights == [0.5, 0.5, 1.0, 1.0, 1.0]


def test_balance_refused_where_it_does_not_apply() -> None:
    with pytest.raises(ValueError, match="balance must be one of"):
        A.sample("train", 1, 5, balance="answers")
    with pytest.raises(ValueError, match="one-step"):
        A.sample("train", 2, 5, balance="tens")


def test_wordings_vary() -> None:
    exs = A.sample("train", 1, 300, seed=0)
    questions = {re.sub(r"\d+", "N", e["prompt"]) for e in exs}
    assert len(questions) > 100
    assert len({e["prompt"].split()[0] for e in exs}) > 5


def test_larger_number_range() -> None:
    cfg = A.ArithConfig(max_number=99)
    assert cfg.max_value == 198 and A.ArithConfig().max_value == 99
    exs = A.sample("test", 2, 100, seed=0, cfg=cfg)
    assert all(A.verify_example(e) == [] for e in exs)
    assert max(int(n) for e in exs for n in re.findall(r"\d+", e["prompt"])) > 50
    with pytest.raises(ValueError):
        A.ArithConfig(max_number=120)
    with pytest.raises(ValueError):
        A.ArithConfig(max_number=60, max_value=99)


def test_extract_final() -> None:
    assert A.final_answer("a 3 + 4 = 7 b\n#### 7") == "7"
    assert A.final_answer("no marker, 3 + 4 = 8") == "8"
    assert A.final_answer("nothing") is None
    assert A.is_correct("#### 007", {"final": "7"}) and not A.is_correct("#### 8", {"final": "7"})


def test_error_kind_names_what_went_wrong() -> None:
    problem = A.make_level1(17, "+", 5, random.Random(0))
    gold = problem["answer"]
    assert problem["key"] == "5+17" and A.error_kind(gold, problem) is None
    cases = {
        "They have 17 + 5 = 23 now.\n#### 23": "off by one",
        "They have 5 + 17 = 12 now.\n#### 12": "off by ten",
        "They have 17 + 6 = 23 now.\n#### 23": "wrong operands",
        "They have 17 - 5 = 12 now.\n#### 12": "wrong operands",
        "They have nothing.": "no answer",
        "They have 17 + 5 = 22 now.\n#### 40": "final disagrees",
        "They have 17 + 5 = 30 now.\n#### 30": "other",
    }
    for text, kind in cases.items():
        assert A.error_kind(text, problem) == kind, text
    # a subtraction's operands keep their order
    minus = A.make_level1(17, "-", 5, random.Random(0))
    assert A.error_kind("So 5 - 17 = 13.\n#### 13", minus) == "wrong operands"
    assert A.error_kind("So 17 - 5 = 13.\n#### 13", minus) == "off by one"
    assert A.ERROR_KINDS[-1] == "other" and len(set(A.ERROR_KINDS)) == len(A.ERROR_KINDS)


def test_toy_examples_draw_as_the_config_says() -> None:
    from elfreg.config import DataConfig
    from elfreg.toy.registry import toy_examples

    def fifties(balance: str) -> float:
        exs = toy_examples(DataConfig(toy_count=3000, toy_balance=balance))
        return sum(A.tens_group(int(A.final_answer(e.answer)), CFG) == 5 for e in exs) / len(exs)

    assert fifties("combination") < 0.07 and abs(fifties("tens") - 1 / 6) < 0.03


def test_mixed_draws_hold_the_share_of_one_step_problems_throughout() -> None:
    from elfreg.config import DataConfig
    from elfreg.toy.registry import toy_examples

    mixed = A.sample_mixed("train", 2000, 0.25, seed=3, cfg=CFG, balance="tens")
    levels = [p["level"] for p in mixed]
    assert levels.count(1) == 500 and levels.count(2) == 1500
    # shuffled: the first and the last quarter each hold about a quarter of one-step problems
    assert all(abs(levels[i:i + 500].count(1) / 500 - 0.25) < 0.07 for i in (0, 1500))
    assert all(A.in_split(p["key"], "train", CFG) for p in mixed)
    # each kind is what sample() draws for its level and seed; the same seed gives the same list
    chains = A.sample("train", 2, 1500, seed=3, cfg=CFG)
    assert sorted(p["prompt"] for p in mixed if p["level"] == 2) == sorted(p["prompt"] for p in chains)
    assert A.sample_mixed("train", 2000, 0.25, seed=3, cfg=CFG, balance="tens") == mixed
    with pytest.raises(ValueError, match="level1_share"):
        A.sample_mixed("train", 10, 1.0)
    exs = toy_examples(DataConfig(toy_level=2, toy_count=400, toy_level1_share=0.5, toy_balance="tens"))
    assert sum(e.answer.count("\n") == 1 for e in exs) == 200  # one equation line and "#### N": one step
