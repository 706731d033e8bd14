"""Scoring predictions: per-problem aggregation, coverage, limits and the failure histogram."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from elfreg.eval import Verdict, get_task, score_predictions
from elfreg.eval.scoring import reason_kind, tally_verdicts


@pytest.fixture
def tiny_gsm8k(tmp_path: Path) -> Path:
    """A four-question GSM8K file in the benchmark's own format (answers 2, 5, 10, 1)."""
    rows = [{"question": f"q{i}", "answer": f"work\n#### {a}"} for i, a in enumerate((2, 5, 10, 1))]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _preds() -> list[dict]:
    # seed:       0       1       2
    # gsm8k/0   right   right   wrong
    # gsm8k/1   right   wrong   no number
    # gsm8k/2   wrong   wrong   right
    # gsm8k/3   (no predictions)
    outputs = {"gsm8k/0": ["#### 2", "#### 2", "#### 7"],
               "gsm8k/1": ["#### 5", "#### 6", "I do not know"],
               "gsm8k/2": ["#### 1", "#### 11", "so 10"]}
    return [{"task_id": tid, "completion": text, "seed": j} for tid, texts in outputs.items()
            for j, text in enumerate(texts)]


def test_score_aggregates_per_seed_with_sample_std(tiny_gsm8k: Path, tmp_path: Path) -> None:
    task = get_task("gsm8k", source=str(tiny_gsm8k))
    report = score_predictions(task, _preds(), out_dir=tmp_path / "out")
    s = report.summary
    assert s["per_seed"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert s["pass@1"] == pytest.approx(4 / 9)
    # by hand: deviations 2/9, -1/9, -1/9 from 4/9; (4 + 1 + 1)/81 / (3 - 1) = 1/27
    assert s["pass@1_std"] == pytest.approx(1 / math.sqrt(27), abs=1e-12)
    assert s["pass@3"] == pytest.approx(1.0) and s["pass@2"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    assert (s["n_problems"], s["n_problems_total"], s["n_samples"]) == (3, 4, 9)
    assert s["coverage"] == pytest.approx(0.75) and s["missing_task_ids"] == ["gsm8k/3"]
    assert s["failure_reasons"] == {"wrong answer": 4, "no answer found": 1}
    assert s["config"]["data"]["path"] == str(tiny_gsm8k) and s["config"]["alias"] is True
    assert [(r["task_id"], r["sample"], r["passed"]) for r in report.records[:3]] == [
        ("gsm8k/0", 0, True), ("gsm8k/0", 1, True), ("gsm8k/0", 2, False)]
    assert report.records[0]["meta"] == {"seed": 0} and report.records[2]["extracted"] == "7"
    written = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert written == report.records


def test_limit_scores_only_the_first_problems(tiny_gsm8k: Path) -> None:
    report = score_predictions(get_task("gsm8k", source=str(tiny_gsm8k)), _preds(), limit=2)
    s = report.summary
    assert (s["n_problems"], s["n_problems_total"], s["n_missing"]) == (2, 2, 0)
    assert s["predictions_ignored_by_limit"] == 3
    assert s["per_seed"] == pytest.approx([1.0, 0.5, 0.0])


def test_tally_gathers_scores_failures_and_aliases() -> None:
    verdicts = [
        Verdict(True, "p", "", {"base": True, "base_noalias": False}, {"aliased_from": "solve"}),
        Verdict(False, "p", "AssertionError at test line 1: assert f(1) == 2", {"base": False, "base_noalias": False}),
        Verdict(True, "p", "", {"base": True, "base_noalias": True}, {"aliased_from": None}),
    ]
    tally = tally_verdicts(["A/0", "A/0", "A/1"], verdicts)
    assert tally.per_problem == {"A/0": [True, False], "A/1": [True]}
    assert tally.per_score["base_noalias"] == {"A/0": [False, False], "A/1": [True]}
    assert tally.failures == {"AssertionError": 1} and tally.aliased == 1


@pytest.mark.parametrize(("reason", "kind"), [
    ("expected 18", "wrong answer"),
    ("AssertionError at test line 2: assert f(3) == 'expected '", "AssertionError"),
    ("wall-clock limit of 10 s exceeded", "timeout"),
    ("input #3: time limit exceeded", "timeout"),
    ("memory limit of 4096 MiB exceeded (MemoryError)", "memory limit"),
    ("killed by signal SIGSEGV", "killed"),
    ("entry point 'f' missing (alias from 'g' not allowed)", "entry point missing"),
    ("no option letter found", "no answer found"),
    ("something odd happened", "something odd happened"),
])
def test_reason_kind_histogram_categories(reason: str, kind: str) -> None:
    assert reason_kind(reason) == kind
