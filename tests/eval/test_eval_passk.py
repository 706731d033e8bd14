"""pass@k estimator and aggregation."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from elfreg.eval.passk import default_ks, pass_at_k, summarize


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) containing a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration_over_subsets(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_binomial_formula_for_large_n() -> None:
    for n, c, k in [(16, 3, 1), (16, 3, 8), (100, 7, 10), (200, 1, 100)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_pass_at_1_is_fraction_correct_and_edges() -> None:
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)
    assert pass_at_k(16, 0, 16) == 0.0
    assert pass_at_k(16, 1, 16) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_default_ks() -> None:
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(10) == [1, 2, 4, 8, 10]
    assert default_ks(1) == [1]


def test_summarize_mean_std_across_seeds_and_passk() -> None:
    verdicts = {
        "p0": [True, True, False, False],
        "p1": [True, False, False, False],
        "p2": [False, False, False, False],
    }
    s = summarize(verdicts)
    per_seed = [2 / 3, 1 / 3, 0.0, 0.0]
    assert s["per_seed"] == pytest.approx(per_seed)
    assert s["pass@1"] == pytest.approx(statistics.fmean(per_seed))
    assert s["pass@1_std"] == pytest.approx(statistics.stdev(per_seed))
    assert s["n_problems"] == 3 and s["n_samples"] == 12
    expected_p2 = (pass_at_k(4, 2, 2) + pass_at_k(4, 1, 2) + 0.0) / 3
    assert s["pass@k"]["pass@2"] == pytest.approx(expected_p2)
    assert set(s["pass@k"]) == {"pass@1", "pass@2", "pass@4"}


def test_summarize_uneven_sample_counts_uses_common_ks() -> None:
    s = summarize({"a": [True] * 16, "b": [False] * 3})
    assert set(s["pass@k"]) == {"pass@1", "pass@2", "pass@3"}
    assert s["pass@1"] == pytest.approx(0.5)
    assert summarize({})["pass@1"] is None


def test_pass_at_1_std_is_the_sample_std_across_seeds() -> None:
    # per-seed accuracy 2/3, 1/3, 0, 0: mean 1/4, squared deviations 25/144, 1/144, 9/144, 9/144
    # sum 44/144, divided by n - 1 = 3: 11/108
    s = summarize({"p0": [True, True, False, False], "p1": [True, False, False, False], "p2": [False] * 4})
    assert s["pass@1_std"] == pytest.approx(math.sqrt(11 / 108), abs=1e-12)
    assert s["pass@1_std"] == pytest.approx(0.3191423692521127, abs=1e-12)
    assert s["pass@1_std"] != pytest.approx(statistics.pstdev(s["per_seed"]))  # not the population std
    two = summarize({"a": [True, False]})  # seeds 1.0 and 0.0: |1 - 0| / sqrt(2)
    assert two["pass@1_std"] == pytest.approx(1 / math.sqrt(2))


def test_pass_at_1_std_with_a_single_seed_is_zero() -> None:
    s = summarize({"a": [True], "b": [False], "c": [True]})
    assert s["per_seed"] == pytest.approx([2 / 3]) and s["pass@1_std"] == 0.0
    assert summarize({})["pass@1_std"] is None  # nothing scored
