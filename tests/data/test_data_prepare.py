"""Prepared shards: exact token accounting (recounted by hand), mixtures with epoch
multipliers, training from shards equal to training from the same examples in memory (and exact
resume), epoch budgets, starting from a checkpoint, and the ``elfreg data`` commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from data_helpers import paper_config

from elfreg.checkpoint import open_checkpoint
from elfreg.cli import main
from elfreg.data.examples import Example
from elfreg.data.prepare import open_prepared, prepare
from elfreg.data.shards import ShardedExamples
from elfreg.train.build import build_run, init_from, start_run, steps_for_epochs
from elfreg.train.loop import train

from conftest import CHARS

A = [("add 1 2", "1+2=3"), ("a much longer prompt here", "x"), ("q", "a very long answer that cannot fit")]
B = [(f"b{i}", f"r{i}") for i in range(4)]
EXAMPLES = [Example(f"add {a} {b}", f"{a}+{b}={a + b}") for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]


def _write(path, pairs):
    path.write_text("".join(json.dumps({"q": q, "a": a}) + "\n" for q, a in pairs))
    return str(path)


def _mixture(tiny_cfg, tmp_path, epochs=(2.0, 0.5), **train):
    sources = [{"kind": "jsonl", "path": _write(tmp_path / f"{n}.jsonl", rows), "prompt_field": "q",
                "answer_field": "a", "epochs": e, "name": n}
               for n, rows, e in (("A", A, epochs[0]), ("B", B, epochs[1]))]
    return tiny_cfg(data={"source": "mixture", "sources": sources, "prepared": str(tmp_path / "prep"),
                          "shard_rows": 2}, train=train)


def test_token_accounting_is_exact(tiny_cfg, tmp_path):
    cfg = _mixture(tiny_cfg, tmp_path)
    assert all(c in CHARS for q, a in A + B for c in q + a)  # one token per character
    stats = prepare(cfg, cfg.data.prepared)
    L, cap = cfg.text.canvas_len, cfg.text.prompt_cap
    samples = [*A, *A, B[0], B[0]]  # A twice; B's rows are alike in length, so any half of them counts the same
    by_hand = {"samples": 8, "tokens": sum(len(q) + len(a) + 1 for q, a in samples), "prompt_tokens_cut": 0,
               "answer_tokens_cut": 0, "eos_cut": 0}
    for q, a in samples:
        kept_q = min(len(q), cap)
        room = L - kept_q
        by_hand["prompt_tokens_cut"] += len(q) - kept_q
        by_hand["answer_tokens_cut"] += max(0, len(a) - room)
        by_hand["eos_cut"] += len(a) >= room
    assert {k: stats["total"][k] for k in by_hand} == by_hand
    assert by_hand["prompt_tokens_cut"] == 2 * (25 - 10) and by_hand["eos_cut"] == 2
    total = stats["total"]
    assert total["tokens"] == total["prompt_tokens"] + total["answer_tokens"] + total["eos_tokens"]
    assert total["tokens_on_canvas"] == total["tokens"] - 30 - by_hand["answer_tokens_cut"] - 2
    a_stats, b_stats = stats["sources"]
    assert (a_stats["rows_in"], a_stats["rows_out"], a_stats["samples"]) == (3, 3, 6)
    assert (b_stats["rows_in"], b_stats["rows_out"], b_stats["samples"]) == (4, 4, 2)
    assert a_stats["tokens"] + b_stats["tokens"] == total["tokens"] and stats["rows"] == 7


def test_shards_hold_the_token_ids_and_the_mixture(tiny_cfg, tmp_path):
    cfg = _mixture(tiny_cfg, tmp_path)
    prepare(cfg, cfg.data.prepared)
    shards = ShardedExamples(cfg.data.prepared)
    assert len(shards.manifest["shards"]) == 4 and shards.rows == 7 and len(shards) == 8
    from elfreg.text.load import load_frozen_text

    tok = load_frozen_text(cfg.text, with_teacher=False).tokenizer
    for r, (q, a) in enumerate(A + B):
        row = shards.row(r)
        assert row.prompt == tok(q, add_special_tokens=False)["input_ids"]
        assert row.answer == tok(a, add_special_tokens=False)["input_ids"]
    samples = np.asarray(shards.samples)
    assert sorted(samples[:6].tolist()) == [0, 0, 1, 1, 2, 2] and set(samples[6:]) <= {3, 4, 5, 6}
    (tmp_path / "again").mkdir()
    again = _mixture(tiny_cfg, tmp_path / "again")
    prepare(again, again.data.prepared)
    assert np.array_equal(np.load(f"{again.data.prepared}/samples.npy"), samples)  # the half is a fixed draw
    with pytest.raises(FileExistsError):
        prepare(cfg, cfg.data.prepared)


def _examples_config(tiny_cfg, tmp_path, **train):
    path = tmp_path / "ex.jsonl"
    path.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in EXAMPLES))
    return EXAMPLES, tiny_cfg(data={"source": "jsonl", "path": str(path)}, train=train)


def test_training_from_shards_equals_training_from_the_examples(tiny_cfg, tmp_path):
    examples, cfg = _examples_config(tiny_cfg, tmp_path, steps=4, batch_size=3, out_dir=str(tmp_path / "mem"),
                                     device="cpu", precision="fp32")
    prepare(cfg, tmp_path / "prep")
    shard_cfg = tiny_cfg(data={**json.loads(json.dumps(cfg.to_dict()["data"])), "prepared": str(tmp_path / "prep")},
                         train={**cfg.to_dict()["train"], "out_dir": str(tmp_path / "shards")})
    assert len(open_prepared(shard_cfg)) == len(examples)
    train(cfg, examples)
    train(shard_cfg)
    sliced = tiny_cfg(data=shard_cfg.to_dict()["data"], train={**shard_cfg.to_dict()["train"],
                                                                 "out_dir": str(tmp_path / "sliced")})
    train(sliced, stop_at=2)
    train(sliced)
    lines = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
             for d in ("mem", "shards", "sliced")]
    assert len(lines[0]) == 4
    for a, b, c in zip(*lines, strict=True):
        for key in ("total", "elf", "repa", "reg", "grad_norm"):
            assert a[key] == b[key] == c[key], (a["step"], key)


def test_a_prepared_folder_from_another_recipe_is_refused(tiny_cfg, tmp_path):
    _, cfg = _examples_config(tiny_cfg, tmp_path)
    prepare(cfg, tmp_path / "prep")
    other = tiny_cfg(data={**cfg.to_dict()["data"], "template": "gsm8k", "prepared": str(tmp_path / "prep")})
    with pytest.raises(ValueError, match=r"different recipe \(differs in: template\)"):
        open_prepared(other)
    with pytest.raises(FileNotFoundError, match="not a prepared data folder"):
        open_prepared(tiny_cfg(data={**cfg.to_dict()["data"], "prepared": str(tmp_path)}))


def test_epochs_set_the_steps_from_the_sample_count(tiny_cfg, tmp_path):
    examples, cfg = _examples_config(tiny_cfg, tmp_path, epochs=2.0, steps=1000, batch_size=3, ckpt_every=100)
    assert steps_for_epochs(2.0, 4, 3) == 3 and steps_for_epochs(12, 2_404_028, 64) == 450_756
    result = train(cfg, examples)
    assert result.step == 3 and len([x for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]) == 3
    saved = open_checkpoint(tmp_path / "run").config
    assert saved.train.steps == 3 and saved.train.epochs == 2.0


def test_init_from_starts_from_the_weights_with_a_fresh_optimiser(tiny_cfg, tmp_path):
    examples, first = _examples_config(tiny_cfg, tmp_path, steps=2, out_dir=str(tmp_path / "gsm8k"))
    train(first, examples)
    weights = open_checkpoint(tmp_path / "gsm8k").model_state()
    cfg = tiny_cfg(train={"steps": 2, "out_dir": str(tmp_path / "math"), "init_from": str(tmp_path / "gsm8k")},
                   text={"prompt_cap": 8})
    run, step = start_run(cfg, examples)
    assert step == 0 and run.optimizer.state_dict()["state"] == {}
    assert all(torch.equal(run.student.state_dict()[k], weights[k]) for k in weights)
    assert all(torch.equal(run.ema.state_dict()[k], weights[k].float()) for k in weights)
    wider = tiny_cfg(model={"width": 64, "heads": 2}, train={"out_dir": str(tmp_path / "w")})
    with pytest.raises(ValueError, match="different 'model' config"):
        init_from(build_run(wider, examples), tmp_path / "gsm8k")


def test_the_paper_gsm8k_recipe_prepares_decontaminates_and_compares_with_table_8(tiny_assets, tmp_path, capsys):
    out = tmp_path / "prep"
    cfg = paper_config("gsm8k", [f"text.tokenizer={tiny_assets['encoder']}", f"data.prepared={out}"])
    cfg.save(tmp_path / "gsm8k.yaml")
    assert main(["data", "prepare", "--config", str(tmp_path / "gsm8k.yaml")]) == 0
    printed = capsys.readouterr().out
    stats = json.loads((out / "stats.json").read_text())
    omi, mm = stats["sources"]
    assert omi["decontaminated"] == {"exact": 1, "8gram": 0, "ast": 0, "group": 0}  # the planted Janet question
    assert mm["decontaminated"]["group"] == 2  # both rewrites of the robe question (a GSM8K test question)
    assert (omi["rows_out"], mm["rows_out"]) == (3, 2) and stats["total"]["samples"] == 5
    assert stats["decontamination"]["groups_dropped"] == 2 and stats["train_epochs"] == 12
    assert stats["train_tokens"] == 12 * stats["total"]["tokens"]
    assert "paper Table 8 (gsm8k)" in printed and "2.404M" in printed and "rows/s" in printed
    assert main(["data", "stats", "--config", str(tmp_path / "gsm8k.yaml")]) == 0
    assert "6.696B" in capsys.readouterr().out
    assert main(["data", "stats", "--prepared", str(tmp_path)]) == 2
    assert "no statistics" in capsys.readouterr().err
