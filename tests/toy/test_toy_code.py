"""The code toy task: reference solutions pass, wrong ones fail, splits disjoint on parameters.

Programs are scored in the evaluation sandbox; the reasons it gives are tested with it
(``tests/eval/test_eval_code_exec.py``)."""

from __future__ import annotations

import os
import random

from elfreg.toy import code as C


def test_reference_solutions_pass_hidden_tests() -> None:
    exs = C.heldout("test")
    rng = random.Random(0)
    picked = {}
    for ex in exs:  # one problem per family, all in one program, keeps the sandbox runs few
        picked.setdefault(ex["family"], ex)
    picked = list(picked.values()) + rng.sample(exs, 4)
    assert len({e["family"] for e in picked}) >= 12
    program = "\n\n".join(e["answer"] for e in picked)
    tests = [t for e in picked for t in e["tests"]]
    assert C.score_program({"tests": tests}, program, timeout=10)
    assert not C.score_program({"tests": tests}, program.replace("return", "return 1 +", 1), timeout=10)
    for ex in picked:
        assert len(ex["tests"]) >= 3
        assert f"def {ex['entry_point']}(" in ex["answer"]
        assert ex["entry_point"] in ex["prompt"]


def test_wrong_crashing_and_slow_programs_fail() -> None:
    ex = C.make_problem("add", (3,), random.Random(0))
    assert ex["entry_point"] == "add_three"
    assert C.score_program(ex, ex["answer"])
    assert not C.score_program(ex, "def add_three(x):\n    return x + 4")
    assert not C.score_program(ex, "def add_3(x):\n    return x + 3")  # the tests call add_three
    assert not C.score_program(ex, "def add_three(x:\n")
    assert not C.score_program(ex, ex["answer"] + "\nimport sys\nsys.exit(0)")  # ends before the tests
    # right after 30 s: failing at 1 s is the time limit's doing
    assert not C.score_program(ex, "import time\ntime.sleep(30)\n" + ex["answer"], timeout=1)
    assert not C.score_program(ex, "def add_three(x):\n    return 3")


def test_programs_run_with_a_scrubbed_environment_elsewhere(monkeypatch) -> None:
    monkeypatch.setenv("ELFREG_SECRET_PROBE", "leak")
    probe = "import os\nassert 'ELFREG_SECRET_PROBE' not in os.environ\nassert os.getcwd() != {!r}"
    assert C.score_program({"tests": []}, probe.format(os.getcwd()))
    assert not C.score_program({"tests": []}, "import os\nassert os.environ.get('ELFREG_SECRET_PROBE') == 'leak'")


def test_hidden_tests_distinguish_neighbouring_parameters() -> None:
    # The tests of a key must reject the reference solution of a neighbouring key.
    for family, params, other in [("add", (5,), (6,)), ("between", (3, 7), (3, 8)),
                                  ("list_above", (4,), (5,)), ("str_first", (2,), (3,))]:
        ex = C.make_problem(family, params, random.Random(0))
        neighbour = C.make_problem(family, other, random.Random(0))
        program = neighbour["answer"].replace(neighbour["entry_point"], ex["entry_point"])
        assert not C.score_program(ex, program), (family, params)


def test_splits_disjoint_and_sizes() -> None:
    sizes = C.split_sizes()
    assert sizes == {"train": 418, "valid": 78, "test": 105}
    assert sum(sizes.values()) == len(C.combinations()) == 601
    train = C.sample("train", 2000, seed=0)
    train_keys = {e["key"] for e in train}
    for split in ("valid", "test"):
        held = C.heldout(split)
        assert len(held) == sizes[split]
        assert not {e["key"] for e in held} & train_keys
        assert not {e["prompt"] for e in held} & {e["prompt"] for e in train}
    assert {C.split_of(k) for k in train_keys} == {"train"}
    assert not {e["key"] for e in C.heldout("valid")} & {e["key"] for e in C.heldout("test")}


def test_deterministic_and_varied() -> None:
    assert C.sample("train", 30, seed=1) == C.sample("train", 30, seed=1)
    assert C.sample("train", 30, seed=1) != C.sample("train", 30, seed=2)
    exs = C.sample("train", 300, seed=0)
    assert len({e["family"] for e in exs}) == len(C.FAMILIES)
    assert len({e["prompt"].split()[0] for e in exs}) >= 4
    assert C.hidden_tests("add", (3,)) == C.make_problem("add", (3,), random.Random(9))["tests"]


def test_number_word() -> None:
    assert [C.number_word(n) for n in (0, 3, 13, 20, 21, 99)] == [
        "zero", "three", "thirteen", "twenty", "twenty_one", "ninety_nine"]
