"""pass@k and pass@1-with-seed-spread from per-sample verdicts (ELF-REG §5, App. B).

* :func:`pass_at_k` is the unbiased estimator of Chen et al. (2021) from ``n`` samples with ``c``
  correct: ``1 − C(n−c, k) / C(n, k)``, computed as the stable product
  ``1 − Π_{i=n−c+1}^{n} (1 − k/i)``.
* :func:`summarize` turns per-problem lists of booleans (index ``j`` = sample ``j`` = generation
  seed ``seed + j``) into pass@1 = the mean over problems and seeds, the *sample* standard
  deviation (``statistics.stdev``, divisor n − 1) of the per-seed accuracies across seeds, and
  pass@k for every power of two k ≤ the smallest n. The seeds are a sample of the generation
  randomness, hence n − 1; with a single seed the spread is unknown and reported as 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

__all__ = ["pass_at_k", "summarize", "default_ks"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n``
    (``c`` of them correct) is correct: ``1 − C(n−c, k)/C(n, k)``."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def default_ks(n_min: int) -> list[int]:
    """1, 2, 4, … up to ``n_min``, plus ``n_min`` itself."""
    ks = []
    k = 1
    while k <= n_min:
        ks.append(k)
        k *= 2
    if n_min >= 1 and n_min not in ks:
        ks.append(n_min)
    return ks


def summarize(
    verdicts: Mapping[str, Sequence[bool]],
    ks: Sequence[int] | None = None,
) -> dict[str, object]:
    """Aggregate per-problem verdict lists.

    Args:
        verdicts: ``task_id → [passed of sample 0, sample 1, …]``; problems may have different
            numbers of samples (pass@k then uses the ks every problem supports).
        ks: which pass@k to report (default :func:`default_ks` of the smallest sample count).

    Returns:
        ``n_problems``, ``n_samples``, ``pass@1`` (mean over problems of c/n, which equals the
        mean over problems and seeds when every problem has the same n), ``pass@1_std`` (sample
        standard deviation, divisor n − 1, across seeds of the per-seed accuracy; 0 with one
        seed),
        ``per_seed`` accuracies and ``pass@k`` for each k (mean over problems).
    """
    lists = {tid: [bool(v) for v in vs] for tid, vs in verdicts.items() if len(vs) > 0}
    if not lists:
        return {"n_problems": 0, "n_samples": 0, "pass@1": None, "pass@1_std": None, "per_seed": [],
                "pass@k": {}}
    n_min = min(len(v) for v in lists.values())
    n_max = max(len(v) for v in lists.values())
    ks = [k for k in (ks or default_ks(n_min)) if 1 <= k <= n_min]
    passk = {}
    for k in ks:
        passk[f"pass@{k}"] = statistics.fmean(pass_at_k(len(v), sum(v), k) for v in lists.values())
    per_seed = []
    for j in range(n_max):
        column = [v[j] for v in lists.values() if len(v) > j]
        per_seed.append(statistics.fmean(column))
    std = statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0
    return {
        "n_problems": len(lists),
        "n_samples": sum(len(v) for v in lists.values()),
        "pass@1": statistics.fmean(sum(v) / len(v) for v in lists.values()),
        "pass@1_std": std,
        "per_seed": per_seed,
        "pass@k": passk,
    }

