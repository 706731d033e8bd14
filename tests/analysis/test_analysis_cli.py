"""``elfreg analyze trajectory`` end to end on a trained toy checkpoint: the outputs, the
invariants that hold by construction, resuming and the folder's identity."""

from __future__ import annotations

import json

import pytest

import elfreg.analysis.cli as analysis_cli
import elfreg.analysis.measure as measure
from elfreg.cli import main

ARGS = ["--task", "gsm8k", "--split", "test", "--limit", "2", "--master", "16", "--nfes", "4,8", "--seeds", "0,1",
        "--acceleration", "5", "--observe-every", "2", "--no-progress"]


@pytest.fixture(scope="module")
def checkpoint(tiny_assets, tmp_path_factory):
    """The cheapest real checkpoint of the toy task: the tiny test LMs, toy arithmetic, 4 steps."""
    from elfreg.train.loop import train

    from conftest import tiny_config

    root = tmp_path_factory.mktemp("analysis")
    cfg = tiny_config(tiny_assets, root, text={"canvas_len": 120, "prompt_cap": 100},
                      data={"source": "toy-arith", "toy_count": 32}, train={"steps": 4, "ckpt_every": 4})
    train(cfg)
    return cfg.train.out_dir


def _analyze(checkpoint, out, *extra):
    return main(["analyze", "trajectory", "--checkpoint", str(checkpoint), "--out", str(out), *ARGS, *extra])


def test_table11_fig2_and_resume(checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert _analyze(checkpoint, out) == 0
    printed = capsys.readouterr().out
    assert "master M = 16" in printed and "flips NFE 8 -> 16" in printed and "Prop. 1" in printed
    summary = json.loads((out / "table11.json").read_text())
    cfg = summary["config"]
    assert cfg["checkpoint"].endswith("step-0000004") and cfg["master"] == 16 and cfg["nfes"] == [4, 8]
    assert cfg["seeds"] == [0, 1] and cfg["task"]["source"] == "toy-arith:test" and cfg["args"]["limit"] == 2
    assert summary["pairs"] == 4 and summary["observations"] == list(range(2, 17, 2))
    per_nfe = {e["nfe"]: e for e in summary["per_nfe"]}
    assert sorted(per_nfe) == [4, 8, 16]
    for e in per_nfe.values():
        for key in ("stable_tokens", "exact_agreement", "answer_agreement", "pass@1"):
            assert 0 <= e[key] <= 1
        assert e["endpoint_error"] >= 0
    end = per_nfe[16]  # the endpoint against itself
    assert end["stable_tokens"] == end["exact_agreement"] == end["answer_agreement"] == 1.0
    assert end["endpoint_error"] == 0
    assert per_nfe[4]["stable_tokens"] <= per_nfe[8]["stable_tokens"] <= end["stable_tokens"]
    flips = summary["flips"]
    assert flips["nfe"] == 8 and flips["n"] == 4 and flips["wrong_to_right"] + flips["right_to_wrong"] <= 4
    assert 0 <= summary["prop2"]["holds"] <= 1 and summary["prop2"]["holds_but_output_differs"] == 0
    assert summary["acceleration"]["prop1_points"] == 4 * 4 and 0 <= summary["acceleration"]["prop1_holds"] <= 1
    assert (out / "fig2.png").stat().st_size > 0 and (out / "table11.txt").read_text() in printed

    # resume: a cut last row and a missing pair are redone, nothing else
    lines = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    seen = []
    real = measure.measure_batch

    def counting(models, prompts, seed, *args, **kwargs):
        seen.append((len(prompts), seed))
        return real(models, prompts, seed, *args, **kwargs)

    monkeypatch.setattr(measure, "measure_batch", counting)
    assert _analyze(checkpoint, out) == 0
    assert seen == [(2, 1)]  # the two pairs of seed 1 (the cut one and the missing one)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["seed"]) for r in rows) == [(f"gsm8k/{i}", s) for i in range(2) for s in (0, 1)]
    seen.clear()
    assert _analyze(checkpoint, out) == 0 and seen == []  # all done: nothing is sampled
    again = json.loads((out / "table11.json").read_text())
    assert again["per_nfe"] == summary["per_nfe"] and again["flips"] == summary["flips"]


def test_another_config_in_a_used_folder_is_one_line(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert _analyze(checkpoint, out, "--seeds", "0", "--acceleration", "0") == 0
    capsys.readouterr()
    assert _analyze(checkpoint, out, "--seeds", "0", "--acceleration", "0", "--master", "32") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds another analysis" in err and "master: 16 there, 32 now" in err
    assert _analyze(checkpoint, out, "--seeds", "0", "--acceleration", "0", "--master", "32", "--overwrite") == 0
    summary = json.loads((out / "table11.json").read_text())
    assert summary["master"] == 32 and "acceleration" not in summary


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["analyze", "trajectory", "--checkpoint", str(tmp_path / "none"), "--task", "gsm8k",
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"elfreg analyze: error: no checkpoint at {tmp_path / 'none'} " \
                                               "(expected model.safetensors or checkpoints/latest)"
    assert main(["analyze", "trajectory", "--checkpoint", str(tmp_path), "--task", "gsm8k", "--out",
                 str(tmp_path / "o"), "--nfes", "4,600"]) == 2
    assert "every NFE must be in [2, master = 512]" in capsys.readouterr().err


class _StopAfterOneBatch:
    """GracefulInterrupt as if SIGTERM arrived during the first batch."""

    signal_name = "SIGTERM"

    def __init__(self):
        self.asked = 0

    @property
    def requested(self):
        self.asked += 1
        return self.asked > 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_a_stop_keeps_the_rows_done_and_the_rerun_finishes(checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    quick = ["--seeds", "0", "--acceleration", "0", "--batch-size", "1"]
    monkeypatch.setattr(analysis_cli, "GracefulInterrupt", _StopAfterOneBatch)
    assert _analyze(checkpoint, out, *quick) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped by SIGTERM" in err and "run the same command again" in err
    assert len((out / "rows.jsonl").read_text().splitlines()) == 1 and not (out / "table11.json").exists()
    monkeypatch.undo()
    assert _analyze(checkpoint, out, *quick) == 0
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "table11.json").read_text())["pairs"] == 2
