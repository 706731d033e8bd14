"""``torchrun ... elfreg eval --checkpoint``: generation sharded over 2 CPU ranks gives the
records and scores of a one-process run."""

from __future__ import annotations

import json
from pathlib import Path

from elfreg.cli import main
from elfreg.data.examples import Example
from elfreg.train.loop import train

from conftest import tiny_config, torchrun


def test_sharded_evaluation_equals_one_process(tiny_assets, tmp_path: Path) -> None:
    cfg = tiny_config(tiny_assets, tmp_path, train={"steps": 4, "ckpt_every": 4, "lr": 3e-3, "ema_decay": 0.0},
                      sample={"nfe": 5})
    train(cfg, [Example(f"add {a} {b}", f"#### {a + b}") for a, b in [(1, 2), (3, 4), (2, 2)]])
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"add {i} 1", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(7)))
    args = ["eval", "--task", "gsm8k", "--source", str(data), "--checkpoint", cfg.train.out_dir, "--samples", "2",
            "--batch-size", "2", "--no-progress", "--precision", "fp32", "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    proc = torchrun([*args, "--out", str(tmp_path / "two")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("results written to") == 1  # rank 0 alone reports

    def records(name: str) -> list[dict]:
        return [json.loads(line) for line in (tmp_path / name / "predictions.jsonl").read_text().splitlines()]

    one, two = records("one"), records("two")
    assert len(one) == 14 and one == two  # same texts, same order (7 chunks of 1 prompt × 2 seeds)
    assert len({r["solution"] for r in one}) > 1  # the samples differ: a real comparison
    s1, s2 = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("one", "two"))
    for key in ("pass@1", "n_samples", "per_seed"):
        assert s1[key] == s2[key], key
    # scoring predictions is not sharded: rank 0 scores, the other ranks leave the folder alone
    proc = torchrun(["eval", "--task", "gsm8k", "--source", str(data), "--predictions",
                     str(tmp_path / "one" / "predictions.jsonl"), "--out", str(tmp_path / "three"), "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    s3 = json.loads((tmp_path / "three" / "summary.json").read_text())
    assert s3["pass@1"] == s1["pass@1"] and s3["n_samples"] == 14
