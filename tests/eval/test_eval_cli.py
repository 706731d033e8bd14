"""The ``elfreg eval`` command and the predictions/score API."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from eval_fakes import fake_checkpoint

from elfreg.cli import main
from elfreg.config import SampleConfig
from elfreg.eval import PredictionError, generation, get_task, score_predictions


def _main(argv: list[str]) -> int:
    return main(["eval", *argv])


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _gsm8k() -> list[dict]:
    """The GSM8K test slice of tests/fixtures (its first 40 problems)."""
    return get_task("gsm8k", source="local").problems()


def test_score_gsm8k_predictions_file_with_coverage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    problems = _gsm8k()
    rows = []
    for p in problems[:3]:  # 4 samples each: right, wrong, right, wrong
        for j in range(4):
            answer = p["answer"] if j % 2 == 0 else "-123456"
            rows.append({"task_id": p["task_id"], "completion": f"Reasoning.\n#### {answer}", "seed": j})
    preds = _write(tmp_path / "preds.jsonl", rows)
    out = tmp_path / "out"
    assert _main(["--task", "gsm8k", "--predictions", str(preds), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "gsm8k"
    total = len(problems)
    assert summary["n_problems"] == 3 and summary["n_problems_total"] == total and summary["n_missing"] == total - 3
    assert summary["coverage"] == pytest.approx(3 / total)
    assert summary["n_samples"] == 12
    assert summary["pass@1"] == pytest.approx(0.5)
    assert summary["per_seed"] == [1.0, 0.0, 1.0, 0.0]
    assert summary["pass@1_std"] == pytest.approx(0.57735, abs=1e-4)
    assert summary["pass@2"] == pytest.approx(1 - 1 / 6) and summary["pass@4"] == 1.0
    assert summary["config"]["template"] == get_task("gsm8k").template
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 12
    assert {"task_id", "sample", "output", "extracted", "passed", "reason"} <= set(samples[0])
    assert [s["sample"] for s in samples[:4]] == [0, 1, 2, 3]
    assert samples[1]["extracted"] == "-123456" and not samples[1]["passed"]
    assert (out / "table.txt").read_text() in printed
    assert f"coverage {100 * 3 / total:.1f}%" in printed


def test_malformed_predictions_fail_with_line_number(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _gsm8k()
    cases = {
        "bad json": (['{"task_id": "gsm8k/0", "completion": "#### 1"}', "", "{not json"], ":3: not valid JSON"),
        "not an object": (['["gsm8k/0", "#### 1"]'], ":1: expected a JSON object, got list"),
        "no text": ([{"task_id": "gsm8k/0"}], ":1: has neither"),
        "both": ([{"task_id": "gsm8k/0", "completion": "a", "solution": "b"}], ":1: has both"),
        "unknown id": ([{"task_id": "gsm8k/0", "completion": "1"}, {"task_id": "HumanEval/1", "completion": "1"}],
                       ":2: unknown task id 'HumanEval/1'"),
        "not a string": ([{"task_id": "gsm8k/0", "solution": 5}], ":1: 'solution' must be a string"),
    }
    for name, (rows, message) in cases.items():
        preds = _write(tmp_path / f"{name}.jsonl", rows)
        assert _main(["--task", "gsm8k", "--predictions", str(preds), "--no-progress"]) == 2, name
        err = capsys.readouterr().err
        assert message in err, (name, err)
        with pytest.raises(PredictionError, match=message.replace("(", r"\(").replace(")", r"\)")):
            score_predictions("gsm8k", preds)


def test_unknown_task_lists_known_tasks(capsys: pytest.CaptureFixture) -> None:
    assert _main(["--task", "nonsense", "--predictions", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    for name in ("gsm8k", "math500", "mmlu", "humaneval", "humaneval+", "mbpp", "mbpp+"):
        assert name in err
    with pytest.raises(ValueError, match="known tasks"):
        get_task("nonsense")
    assert get_task("HumanEvalPlus").name == "humaneval+" and get_task("mbppplus").name == "mbpp+"


def test_checkpoint_path_generates_with_the_given_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    problems = _gsm8k()
    calls = []

    def fake_generate(checkpoint, prompts, sample, samples, seed, batch_size, device, precision):
        calls.append(dict(checkpoint=checkpoint, prompts=prompts, sample=sample, samples=samples, seed=seed,
                          batch_size=batch_size))
        # the prompt holds the question, in whatever template the checkpoint was trained with
        gold = [next(p["answer"] for p in problems[:5] if p["question"] in pr) for pr in prompts]
        # sample j (seed + j) is right exactly when j is even
        return [[f"#### {g}" if j % 2 == 0 else "#### 0.5" for j in range(samples)] for g in gold]

    monkeypatch.setattr(generation, "_generate", fake_generate)
    out = tmp_path / "out"
    ckpt = fake_checkpoint(tmp_path / "ckpt")
    rc = _main(["--task", "gsm8k", "--checkpoint", str(ckpt), "--samples", "4", "--nfe", "16",
                "--sampler", "full-span", "--renoise-eta", "0.5", "--seed", "7", "--limit", "5", "--out", str(out),
                "--no-progress"])
    assert rc == 0
    # chunks of lcm(batch 8, samples 4) = 8 jobs = 2 prompts
    assert [len(c["prompts"]) for c in calls] == [2, 2, 1]
    expected = SampleConfig().replace(nfe=16, sampler="full-span", renoise_eta=0.5)
    for call in calls:
        assert call["sample"] == expected and call["checkpoint"] == ckpt.resolve()
        assert (call["samples"], call["seed"], call["batch_size"]) == (4, 7, 8)
    assert problems[0]["question"] in calls[0]["prompts"][0] and problems[4]["question"] in calls[2]["prompts"][0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["n_not_scored"] == 0
    assert summary["n_problems"] == 5 and summary["n_problems_total"] == 5 and summary["coverage"] == 1.0
    assert summary["pass@1"] == pytest.approx(0.5) and summary["per_seed"] == [1.0, 0.0, 1.0, 0.0]
    assert summary["config"]["sample"]["nfe"] == 16 and summary["config"]["checkpoint"] == str(ckpt)
    assert summary["config"]["eval"]["samples"] == 4
    identity = json.loads((out / "eval_config.json").read_text())
    assert identity["sample"] == dataclasses.asdict(expected) and identity["checkpoint"] == str(ckpt.resolve())
    assert (identity["task"], identity["samples"], identity["seed"], identity["limit"]) == ("gsm8k", 4, 7, 5)
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["seed"] for p in preds[:4]] == [7, 8, 9, 10]
    # the saved predictions re-score to the same numbers
    again = score_predictions("gsm8k", out / "predictions.jsonl")
    assert again.summary["pass@1"] == summary["pass@1"]


def test_bad_settings_fail_with_one_line_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for flags, line in ((["--nfe", "1"], "config error: sample.nfe: must be an integer >= 2, got 1"),
                        (["--samples", "0"], "config error: eval.samples: must be >= 1, got 0"),
                        (["--nfes", "16,1"], "config error: eval.nfes: every NFE must be >= 2, got [16, 1]")):
        assert _main(["--task", "gsm8k", "--checkpoint", str(tmp_path / "missing"), *flags]) == 2
        assert capsys.readouterr().err.strip() == line


def test_a_real_checkpoint_end_to_end_with_an_nfe_sweep(tiny_assets, tmp_path: Path) -> None:
    from elfreg.data.examples import Example
    from elfreg.train.loop import train

    from conftest import tiny_config

    cfg = tiny_config(tiny_assets, tmp_path, train={"steps": 2, "ckpt_every": 2}, sample={"nfe": 6})
    train(cfg, [Example(f"add {a} {b}", f"#### {a + b}") for a, b in [(1, 2), (3, 4)]])
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"add {i} 1", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(3)))
    out = tmp_path / "out"
    assert _main(["--task", "gsm8k", "--source", str(data), "--checkpoint", cfg.train.out_dir, "--samples", "2",
                  "--nfes", "3,5", "--out", str(out), "--no-progress"]) == 0
    for nfe in (3, 5):
        folder = out / f"nfe{nfe}"
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["config"]["sample"]["nfe"] == nfe and summary["config"]["sample"]["sampler"] == "early-stop"
        preds = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
        assert [(p["task_id"], p["seed"]) for p in preds] == [(f"gsm8k/{i}", j) for i in range(3) for j in range(2)]
        assert summary["n_samples"] == 6 and len(summary["per_seed"]) == 2


def test_humaneval_predictions_report_both_alias_scores(tmp_path: Path) -> None:
    task = get_task("humaneval")
    p0, p1 = task.problem("HumanEval/0"), task.problem("HumanEval/1")
    renamed = p1["prompt"].replace("def separate_paren_groups", "def solve") + p1["canonical_solution"]
    rows = [
        {"task_id": "HumanEval/0", "completion": p0["canonical_solution"]},
        {"task_id": "HumanEval/0", "completion": "    return True\n"},
        {"task_id": "HumanEval/1", "solution": "```python\n" + renamed + "```"},
        {"task_id": "HumanEval/1", "solution": p1["prompt"] + p1["canonical_solution"]},
    ]
    out = tmp_path / "he"
    rc = _main(["--task", "humaneval", "--predictions", str(_write(tmp_path / "p.jsonl", rows)), "--out", str(out),
                "--no-progress", "--workers", "2"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_problems"] == 2 and summary["n_missing"] == len(task.problems()) - 2
    assert summary["scores"]["base"]["pass@1"] == pytest.approx(0.75)
    assert summary["scores"]["base_noalias"]["pass@1"] == pytest.approx(0.5)
    assert summary["pass@1"] == pytest.approx(0.75) and summary["headline_score"] == "base"
    assert summary["alias"]["samples_aliased"] == 1
    rc = _main(["--task", "humaneval", "--predictions", str(tmp_path / "p.jsonl"), "--out", str(out),
                "--no-progress", "--no-alias", "--overwrite"])
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0 and summary["pass@1"] == pytest.approx(0.5) and summary["headline_score"] == "base_noalias"
    table = (out / "table.txt").read_text()
    assert "base (alias)" in table and "base (no alias)" in table


def test_registered_in_the_main_cli() -> None:
    from elfreg.cli import build_parser as main_parser

    args = main_parser().parse_args(["eval", "--task", "gsm8k", "--predictions", "x.jsonl"])
    assert args.func.__module__ == "elfreg.eval.cli" and args.task == "gsm8k"
