"""Stopping during scoring: no sandbox starts after the stop, jobs not started come back as
``not_run`` and are not counted, and what was scored is written as a partial summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_fakes import gsm8k_file

from elfreg.eval import get_task, score_predictions
from elfreg.eval.sandbox import NOT_RUN, SandboxJob, run_many, supervisor


def _count_launches(monkeypatch: pytest.MonkeyPatch, after_first=None) -> list[str]:
    """Record every sandbox launch (its status once done); ``after_first()`` runs after the first."""
    launched: list[str] = []
    real = supervisor.run_in_sandbox

    def counting(*args, **kwargs):
        res = real(*args, **kwargs)
        launched.append(res.status)
        if len(launched) == 1 and after_first is not None:
            after_first()
        return res

    monkeypatch.setattr(supervisor, "run_in_sandbox", counting)
    return launched


def test_run_many_launches_nothing_after_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    launched = _count_launches(monkeypatch)
    finished: list[int] = []
    jobs = [SandboxJob(f"import time\ntime.sleep(0.2)\nprint({i})", timeout=10) for i in range(5)]
    # asked in the worker right before each launch: after two launches, nothing more starts
    results = run_many(jobs, workers=1, progress=finished.append, should_stop=lambda: len(launched) >= 2)
    assert [r.status for r in results] == ["ok", "ok", NOT_RUN, NOT_RUN, NOT_RUN]
    assert [r.stdout.strip() for r in results[:2]] == ["0", "1"] and results[2].reason.startswith("not run")
    assert launched == ["ok", "ok"] and finished == [1, 1]  # not-run jobs are neither launched nor counted
    assert [r.status for r in run_many(jobs, workers=2, should_stop=lambda: True)] == [NOT_RUN] * 5
    assert len(launched) == 2


def test_a_stopped_text_scoring_reports_only_what_it_checked(tmp_path: Path) -> None:
    task = get_task("gsm8k", source=str(gsm8k_file(tmp_path / "gsm8k.jsonl", 3)))
    preds = [{"task_id": f"gsm8k/{i}", "solution": f"#### {i + 1}"} for i in range(3) for _ in range(2)]
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 3  # three checks, then stop

    report = score_predictions(task, preds, out_dir=tmp_path / "out", should_stop=stop)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["complete"] is False and summary["n_samples"] == 3 and summary["n_not_scored"] == 3
    assert summary["n_problems"] == 2 and summary["pass@1"] == 1.0
    assert len((tmp_path / "out" / "samples.jsonl").read_text().splitlines()) == 3
    assert "PARTIAL: 3 samples not scored" in report.table
    whole = score_predictions(task, preds)
    assert whole.summary["complete"] is True and whole.summary["n_not_scored"] == 0 and "PARTIAL" not in whole.table

