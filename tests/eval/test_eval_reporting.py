"""Reporting: the summary's layout, the printed table and the output files."""

from __future__ import annotations

import collections
import json
import math
import time
from pathlib import Path

import pytest

from elfreg.eval import get_task, sandbox_isolation
from elfreg.eval.reporting import build_summary, format_table, write_jsonl, write_outputs


def _code_summary(alias: bool) -> dict:
    per_problem = {"HumanEval/0": [True, False], "HumanEval/1": [True, True]}
    per_score = {"base": per_problem, "base_noalias": {"HumanEval/0": [True, False], "HumanEval/1": [False, True]}}
    return build_summary(
        get_task("humaneval"), ["HumanEval/0", "HumanEval/1", "HumanEval/2"], per_problem, per_score,
        collections.Counter({"AssertionError": 1}), aliased=1, ignored=0, alias=alias,
        config={"workers": 2}, started=time.monotonic(),
    )


def test_code_summary_reports_every_score_and_the_sandbox() -> None:
    s = _code_summary(alias=False)
    assert s["headline_score"] == "base_noalias"
    assert s["scores"]["base"]["pass@1"] == pytest.approx(0.75)
    assert s["scores"]["base_noalias"]["pass@1"] == pytest.approx(0.5)
    # per-seed accuracy: base 1.0 and 0.5, sample std |1.0 - 0.5| / sqrt(2); no alias 0.5 and 0.5
    assert s["scores"]["base"]["pass@1_std"] == pytest.approx(math.sqrt(2) / 4)
    assert s["scores"]["base_noalias"]["pass@1_std"] == 0.0
    assert s["alias"] == {"headline_uses_alias": False, "samples_aliased": 1}
    assert s["sandbox"] == sandbox_isolation()
    assert s["missing_task_ids"] == ["HumanEval/2"] and s["samples_per_problem"] == {"min": 2, "max": 2}
    assert s["config"]["task"] == "humaneval" and s["config"]["workers"] == 2


def test_table_lists_both_alias_rows_in_percent() -> None:
    table = format_table(_code_summary(alias=True))
    lines = table.splitlines()
    assert lines[0].startswith("task humaneval: 2/3 problems (coverage 66.7%), 4 samples (2-2 per problem)")
    base = next(ln for ln in lines if ln.startswith("base (alias)"))
    noalias = next(ln for ln in lines if ln.startswith("base (no alias)"))
    assert base.split()[2:4] == ["75.00", "35.36"]  # pass@1, and the sample std of seeds 1.0 and 0.5
    assert noalias.split()[3:5] == ["50.00", "0.00"]
    assert "headline: base; samples that needed the alias: 1" in table


def test_outputs_are_written_as_utf8_json(tmp_path: Path) -> None:
    records = [{"task_id": "gsm8k/0", "output": "x = 3·4 → 12"}, {"task_id": "gsm8k/1", "output": ""}]
    write_jsonl(tmp_path / "r.jsonl", records)
    raw = (tmp_path / "r.jsonl").read_text(encoding="utf-8")
    assert "3·4 → 12" in raw and raw.count("\n") == 2
    write_outputs(tmp_path / "out", {"task": "gsm8k"}, records, "table\n")
    assert [json.loads(x) for x in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()] == records
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == {"task": "gsm8k"}
    assert (tmp_path / "out" / "table.txt").read_text() == "table\n"
