"""Generation from a checkpoint: one call into the sampling room, seeds, saved predictions.

The sampling room is replaced at the one seam, ``generation._generate``; ``test_eval_cli.py``
runs the real one on a tiny checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from eval_fakes import fake_checkpoint

from elfreg.config import SampleConfig
from elfreg.eval import EvalError, evaluate_checkpoint, generation, get_task


@pytest.fixture
def tiny_task(tmp_path: Path):
    rows = [{"question": f"q{i}", "answer": f"work\n#### {i + 1}"} for i in range(3)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return get_task("gsm8k", source=str(path))


def test_outputs_are_generated_in_chunks_saved_with_seeds_and_scored(tiny_task, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def generate(checkpoint, prompts, sample, samples, seed, batch_size, device, precision):
        calls.append((checkpoint, prompts, sample, samples, seed))
        # prompt i answers i + 1 (right) in sample 0 only
        first = len(sum((c[1] for c in calls[:-1]), []))
        return [[f"#### {first + i + 1}"] + ["#### 0"] * (samples - 1) for i in range(len(prompts))]

    monkeypatch.setattr(generation, "_generate", generate)
    ckpt = fake_checkpoint(tmp_path / "ckpt")
    overrides = {"nfe": 8, "sampler": "full-span", "sc_cfg": 1.5}
    report = evaluate_checkpoint(tiny_task, str(ckpt), sample_overrides=overrides, samples=2, seed=5, batch_size=4,
                                 out_dir=tmp_path / "out")
    prompts = [tiny_task.prompt(p) for p in tiny_task.problems()]
    # chunks of lcm(batch_size 4, samples 2) = 4 jobs = 2 prompts: whole batches, as one call would make them
    sample = SampleConfig().replace(**overrides)
    assert calls == [(ckpt.resolve(), prompts[:2], sample, 2, 5), (ckpt.resolve(), prompts[2:], sample, 2, 5)]
    assert report.summary["per_seed"] == [1.0, 0.0] and report.summary["pass@1"] == pytest.approx(0.5)
    assert report.summary["config"]["sample"] == dataclasses.asdict(sample) and report.summary["config"]["seed"] == 5
    saved = [json.loads(x) for x in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [(p["task_id"], p["seed"]) for p in saved[:2]] == [("gsm8k/0", 5), ("gsm8k/0", 6)]
    assert saved[0]["solution"] == "#### 1" and len(saved) == 6


def test_wrong_number_of_outputs_is_an_eval_error(tiny_task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation, "_generate", lambda *args: [["#### 1"]])
    with pytest.raises(EvalError, match="returned 1 lists for 3 prompts"):
        evaluate_checkpoint(tiny_task, str(fake_checkpoint(tmp_path / "ckpt")), samples=2)


def test_a_missing_checkpoint_is_named_before_the_data_is_loaded(tmp_path: Path) -> None:
    task = get_task("gsm8k", source=str(tmp_path / "no-such-data.jsonl"))  # loading it would fail
    with pytest.raises(EvalError, match=f"no checkpoint at {tmp_path / 'gone'} "):
        evaluate_checkpoint(task, str(tmp_path / "gone"), out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
