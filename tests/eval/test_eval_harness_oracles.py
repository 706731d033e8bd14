"""The in-sandbox harness's comparison rules and input conversions (run in-process here)."""

from __future__ import annotations

import math

from elfreg.eval.code import _harness as h


def test_exact_and_float_tolerance() -> None:
    assert h.matches("HumanEval/0", [], [1, 2], [1, 2], 0)
    assert not h.matches("HumanEval/0", [], [1, 2], (1, 2), 0)  # a tuple is not a list
    # floats: atol 0 becomes 1e-6, rtol 1e-7
    assert h.matches("HumanEval/2", [], 0.1 + 0.2, 0.3, 0)
    assert not h.matches("HumanEval/2", [], 0.3001, 0.3, 0)
    assert h.matches("Mbpp/82", [], 4188.7902, 4188.790204786391, 1e-4)
    assert not h.matches("Mbpp/82", [], 4188.8, 4188.790204786391, 1e-4)
    assert h.matches("X/1", [], [1.0, 2.0000001], [1.0, 2.0], 0)
    assert not h.matches("X/1", [], [1.0], [1.0, 2.0], 0)
    assert not h.matches("X/1", [], "0.3", 0.3, 1e-4)  # type must match for tolerance
    assert not h.matches("X/1", [], float("nan"), 1.0, 1e-4)


def test_special_oracles() -> None:
    # HumanEval/32 find_zero: any root passes, a non-root fails
    assert h.matches("HumanEval/32", [[-6, 11, -6, 1]], 3.0, 1.0, 1e-4)
    assert not h.matches("HumanEval/32", [[-6, 11, -6, 1]], 2.5, 1.0, 1e-4)
    # set-equality tasks
    assert h.matches("Mbpp/2", [], (5, 4), (4, 5), 0)
    assert not h.matches("Mbpp/2", [], (5,), (4, 5), 0)
    # match-object tasks compare truthiness of "not None"
    assert h.matches("Mbpp/737", [], object(), True, 0)
    assert h.matches("Mbpp/737", [], None, False, 0)
    assert not h.matches("Mbpp/737", [], None, True, 0)
    assert h.matches("Mbpp/737", [], False, False, 0)
    # Mbpp/581 accepts the perpendicular-height reading; Mbpp/558 the zero-padded reading
    assert h.matches("Mbpp/581", [3, 4], round(9 + 2 * 3 * math.sqrt(2.25 + 16)), 33, 0)
    assert h.matches("Mbpp/558", [123, 45], h._padded_digit_distance(123, 45), 6, 0)
    assert not h.matches("Mbpp/558", [123, 45], 99, 6, 0)


def test_mbpp_input_type_restoration() -> None:
    assert h.convert_mbpp_input(2, [[3, 4], [5]]) == [(3, 4), (5,)]
    assert h.convert_mbpp_input(63, [[[1, 2], [3, 4]]]) == [[(1, 2), (3, 4)]]
    assert h.convert_mbpp_input(124, [1, "1+2j"]) == [1.0, 1 + 2j]
    assert h.convert_mbpp_input(252, ["1+1j"]) == [1 + 1j]
    assert h.convert_mbpp_input(115, [[[1], [], [2, 3]]]) == [[{1}, {}, {2, 3}]]
    assert h.convert_mbpp_input(580, [[1, [2, [3]]], 4]) == ((1, (2, (3,))), 4)
    assert h.convert_mbpp_input(722, [{"a": [1, 2]}, 3]) == [{"a": (1, 2)}, 3]
    assert h.convert_mbpp_input(11, [[1, 2], "x"]) == [[1, 2], "x"]  # untouched elsewhere
