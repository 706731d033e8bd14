"""Stopping during scoring: no sandbox starts after the stop, jobs not started come back as
``not_run`` and are not counted, and what was scored is written as a partial summary."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from eval_fakes import eval_main, gsm8k_file

from elfreg.eval import get_task, score_predictions
from elfreg.eval.code.sandbox import NOT_RUN, SandboxJob, run_many, supervisor
from elfreg.runs import GracefulInterrupt


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
    jobs = [SandboxJob(f"print({i})", timeout=10) for i in range(5)]
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


def test_sigint_during_code_scoring_writes_a_partial_summary_and_exits_130(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    p0 = get_task("humaneval").problem("HumanEval/0")
    # six distinct programs (a statement of their own in the function, which sanitising keeps)
    rows = [{"task_id": "HumanEval/0", "solution": p0["prompt"] + f"    sample = {k}\n" + p0["canonical_solution"]}
            for k in range(6)]
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))

    handled = threading.Event()
    real_handle = GracefulInterrupt._handle

    def handle(self, signum, frame) -> None:
        real_handle(self, signum, frame)
        handled.set()

    def interrupt() -> None:  # the user presses Ctrl-C once the first result is in
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        # the main thread's handler has run before this worker asks whether to launch the next job
        assert handled.wait(timeout=120), "the main thread never handled the SIGINT"

    monkeypatch.setattr(GracefulInterrupt, "_handle", handle)
    launched = _count_launches(monkeypatch, after_first=interrupt)
    out = tmp_path / "out"
    argv = ["--task", "humaneval", "--predictions", str(preds), "--out", str(out), "--workers", "1", "--no-progress"]
    assert eval_main(argv) == 130
    err = capsys.readouterr().err.splitlines()
    summary = json.loads((out / "summary.json").read_text())
    scored = summary["n_samples"]
    assert scored == 1 and summary["n_not_scored"] == 5 and summary["complete"] is False
    assert len(launched) == scored  # no sandbox started after the stop was seen
    assert len((out / "samples.jsonl").read_text().splitlines()) == scored
    assert err == [f"elfreg eval: stopped by SIGINT: scoring stopped: {scored} of 6 samples scored; a partial summary "
                   f"(complete: false) is in {out / 'summary.json'}; run the same command again to score them all"]
    assert eval_main(argv) == 0  # the same command scores them all
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["n_samples"] == 6 and summary["pass@1"] == 1.0
    assert os.path.exists(out / "eval_config.json")
