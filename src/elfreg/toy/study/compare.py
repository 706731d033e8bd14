"""Per-training-run comparisons of two arms of a study: the test behind "held in every run".

An *arm* is a model (``elf-reg``) or a model with one sampler (``elf-reg/renoise``). For each
training seed ``t`` that both arms have, every cell they share — a (sampler, NFE) pair for two
models, an NFE for two model/sampler arms — gets ``m_A[t] − m_B[t]``, each ``m`` the mean pass@1
over the sampling seeds of that cell. A run's comparison is the count of cells where A is ahead
and the range and mean of the differences; the verdict says whether A (or B) is ahead in the mean
of every training run, or neither is. Training runs of different models share nothing but
their seed, so the comparison is per run, not a paired test.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from elfreg.config import ConfigError
from elfreg.toy.study.plan import Study

# pass@1 is a share of a fixed problem set: two cells closer than this are level (the same share
# reached by two float paths, a mean of 0/1 scores and a count over n, may differ in its last bit)
LEVEL = 1e-9


def parse_arm(text: str, study: Study) -> tuple[str, str | None]:
    """``"model"`` or ``"model/sampler"`` → (model, sampler or None), checked against the plan."""
    model, _, sampler = text.partition("/")
    if model not in study.plan.models:
        raise ConfigError(f"compare: unknown model {model!r} (the plan has: {', '.join(study.plan.models)})")
    if sampler and (sampler not in study.plan.samplers or not study.applies(model, sampler)):
        known = ", ".join(s for s in study.plan.samplers if study.applies(model, s))
        raise ConfigError(f"compare: model {model!r} has no sampler {sampler!r} in the plan (it has: {known})")
    return model, sampler or None


def cell_means(rows: list[dict], model: str, sampler: str | None) -> dict[int, dict[tuple, float]]:
    """``{training seed: {cell key: mean pass@1 over sampling seeds}}`` of one arm; the key is
    (sampler, nfe) for a model arm and (nfe,) for a model/sampler arm."""
    groups: dict[int, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["model"] != model or (sampler is not None and r["sampler"] != sampler):
            continue
        key = (r["nfe"],) if sampler is not None else (r["sampler"], r["nfe"])
        groups[r["train_seed"]][key].append(r["pass@1"])
    return {t: {k: statistics.fmean(v) for k, v in cells.items()} for t, cells in groups.items()}


def compare_arms(rows: list[dict], a: tuple[str, str | None], b: tuple[str, str | None]) -> dict:
    """A − B per training run over the cells both arms share (module docstring). Two model arms
    share the samplers both models have; a model arm against a model/sampler arm is refused."""
    if (a[1] is None) != (b[1] is None):
        raise ConfigError("compare: give two models or two model/sampler arms, not one of each")
    means_a, means_b = cell_means(rows, *a), cell_means(rows, *b)
    runs = []
    for t in sorted(set(means_a) & set(means_b)):
        shared = [k for k in means_a[t] if k in means_b[t]]
        if not shared:
            continue
        diffs = {k: means_a[t][k] - means_b[t][k] for k in shared}
        values = list(diffs.values())
        runs.append({"train_seed": t, "cells": len(values), "ahead": sum(v > LEVEL for v in values),
                     "behind": sum(v < -LEVEL for v in values), "min": min(values), "max": max(values),
                     "mean": statistics.fmean(values), "diffs": {"/".join(map(str, k)): v for k, v in diffs.items()}})
    return {"a": _name(a), "b": _name(b), "runs": runs, "verdict": verdict(_name(a), _name(b), runs)}


def verdict(a: str, b: str, runs: list[dict]) -> str:
    """Who is ahead in the mean over cells of every training run; with one run, nothing is
    established about training runs."""
    if not runs:
        return "no training run has cells of both arms"
    if len(runs) < 2:
        return "one training run: agreement between runs is unknown"
    for leader, sign, count in ((a, 1, "ahead"), (b, -1, "behind")):
        if all(sign * r["mean"] > LEVEL for r in runs):
            every_cell = all(r[count] == r["cells"] for r in runs)
            return f"{leader} ahead in all {len(runs)} runs" + (", in every cell" if every_cell else "")
    return "neither arm is ahead in every run"


def _name(arm: tuple[str, str | None]) -> str:
    return arm[0] if arm[1] is None else f"{arm[0]}/{arm[1]}"


def _points(v: float) -> str:
    return f"{100 * v:+.1f}"


def format_comparison(c: dict) -> str:
    """The comparison as text: one line per training run, then the verdict."""
    lines = [f"{c['a']} − {c['b']} (pass@1 points per cell, each the mean over sampling seeds)"]
    for r in c["runs"]:
        line = (f"  run t{r['train_seed']}: ahead in {r['ahead']} of {r['cells']} cells, "
                f"{_points(r['min'])} to {_points(r['max'])}, mean {_points(r['mean'])}")
        if r["cells"] <= 8:
            line += " (" + ", ".join(f"{k} {_points(v)}" for k, v in r["diffs"].items()) + ")"
        lines.append(line)
    lines.append(f"  verdict: {c['verdict']}")
    return "\n".join(lines)
