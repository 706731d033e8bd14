"""ELF's tasks in ``elfreg eval``: XSum (ROUGE), WMT14 De-En (BLEU) and unconditional Gen-PPL with
unigram entropy, offline on the rows of tests/fixtures/elf_tasks and tiny random models, each
number checked against the scorer library (rouge-score, sacrebleu, the causal LM's own loss)
called directly on the same texts."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from rouge_score import rouge_scorer
from transformers import AutoModelForCausalLM, AutoTokenizer

from elfreg.cli import main
from elfreg.eval import get_task, score_predictions
from elfreg.eval.text_metrics import generative_perplexity

ROWS = Path(__file__).resolve().parents[1] / "fixtures" / "elf_tasks"
XSUM, WMT = ROWS / "xsum.jsonl", ROWS / "wmt14_de_en.jsonl"
OUTPUTS = ["A bridge will close for repairs after cracks were found.", "Pupils won a prize for a garden.",
           "Rain flooded the city.", "The museum opens a map gallery next spring."]


def _rouge_direct(hyps: list[str], refs: list[str]) -> dict[str, float]:
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(r, h) for h, r in zip(hyps, refs, strict=True)]
    return {k: statistics.fmean(100 * s[k].fmeasure for s in scores) for k in ("rouge1", "rouge2", "rougeL")}


def test_xsum_rouge_is_rouge_score_per_seed_and_averaged_over_seeds(tmp_path):
    task = get_task("xsum", source=str(XSUM))
    problems = task.problems()
    assert [p["task_id"] for p in problems] == [f"xsum/{i}" for i in range(4)]
    assert task.prompt(problems[0]) == problems[0]["document"]  # ELF's models read the bare document
    seeds = [OUTPUTS, [o.upper() + " Also more words." for o in OUTPUTS]]
    rows = [{"task_id": p["task_id"], "solution": seeds[j][i], "seed": j} for i, p in enumerate(problems)
            for j in range(2)]
    report = score_predictions(task, rows, out_dir=tmp_path)
    refs = [p["reference"] for p in problems]
    direct = [_rouge_direct(s, refs) for s in seeds]
    summary = report.summary
    for j in range(2):
        for k in ("rouge1", "rouge2", "rougeL"):
            assert summary["per_seed"][str(j)][k] == pytest.approx(direct[j][k], rel=1e-12)
    for k in ("rouge1", "rouge2", "rougeL"):
        assert summary["metrics"][k] == pytest.approx((direct[0][k] + direct[1][k]) / 2, rel=1e-12)
        assert summary["metrics_std"][k] == pytest.approx(statistics.stdev([direct[0][k], direct[1][k]]), rel=1e-9)
    assert summary["metrics"]["rouge1"] > 10 and summary["complete"] and summary["headline_score"] == "rouge1"
    record = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])
    assert record["reference"] == refs[0] and record["scores"]["rouge1"] == pytest.approx(
        100 * rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True).score(refs[0], OUTPUTS[0])["rouge1"].fmeasure)
    assert "rouge1" in (tmp_path / "table.txt").read_text()


def test_wmt14_bleu_is_sacrebleus_standard_score_and_elfs_setting_beside_it(tmp_path, capsys):
    predictions = tmp_path / "preds.jsonl"
    hyps = ["The train to Berlin is ten minutes late today.", "We walked in the forest for a long time.",
            "The city plans a new bridge across the river.", "the museum is closed on monday."]
    predictions.write_text("".join(json.dumps({"task_id": f"wmt14-de-en/{i}", "solution": h}) + "\n"
                                   for i, h in enumerate(hyps)))
    assert main(["eval", "--task", "wmt14-de-en", "--source", str(WMT), "--predictions", str(predictions),
                 "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    refs = [json.loads(line)["translation"]["en"] for line in WMT.read_text().splitlines()]
    standard = sacrebleu.corpus_bleu(hyps, [refs])
    assert summary["metrics"]["bleu"] == pytest.approx(standard.score, rel=1e-12)
    elf = sacrebleu.corpus_bleu(hyps, [refs], lowercase=True, use_effective_order=True).score
    assert summary["metrics"]["bleu_elf"] == pytest.approx(elf, rel=1e-12) and elf > standard.score
    assert summary["per_seed"]["0"]["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "sacreBLEU nrefs:1" in capsys.readouterr().out


@pytest.fixture(scope="module")
def scoring_lm(tiny_assets):
    folder = tiny_assets["encoder"]  # a random Qwen3 causal LM and its character tokenizer
    return folder, AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _direct_ppl(texts: list[str], model, tok, max_length: int) -> tuple[float, float]:
    """Gen-PPL from the LM's own mean loss per text (each alone, EOS after an uncut text) and ELF's
    numpy unigram entropy."""
    nll, count, entropies = 0.0, 0, []
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"][:max_length]
        seq = ids + [tok.eos_token_id] if len(ids) < max_length else ids
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([seq]), labels=torch.tensor([seq])).loss
        nll += float(loss) * (len(seq) - 1)
        count += len(seq) - 1
        _, counts = np.unique(np.array(ids), return_counts=True)
        probs = counts.astype(np.float32) / counts.sum()
        entropies.append(float(-np.sum(probs * np.log(probs + 1e-10))))
    return math.exp(nll / count), sum(entropies) / len(entropies)


def test_gen_ppl_is_the_lms_own_loss_over_each_text_and_its_end_whatever_the_batching(scoring_lm):
    _, model, tok = scoring_lm
    texts = ["hello world 12", "a much longer text that the limit cuts short", "", "xy", "  "]
    one = generative_perplexity(texts, model, tok, max_length=20, batch_size=1)
    three = generative_perplexity(texts, model, tok, max_length=20, batch_size=3)
    ppl, entropy = _direct_ppl([t for t in texts if t.strip()], model, tok, 20)
    assert one.texts == 3 and one.tokens == 14 + 19 + 2  # empty texts left out; the cut text has no EOS term
    assert one.gen_ppl == pytest.approx(ppl, rel=1e-5) and three.gen_ppl == pytest.approx(ppl, rel=1e-5)
    assert one.entropy == pytest.approx(entropy, rel=1e-6) and three.entropy == one.entropy
    assert one.gen_ppl > 1


def _checkpoint(tiny_assets, tmp_path: Path) -> str:
    from elfreg.data.examples import Example
    from elfreg.train.loop import train

    from conftest import tiny_config

    cfg = tiny_config(tiny_assets, tmp_path, text={"canvas_len": 32, "prompt_cap": 16, "prompt_truncation": "right",
                                                   "answer_cap": 12},
                      train={"steps": 2, "ckpt_every": 2}, sample={"nfe": 4})
    train(cfg, [Example("the town council voted", "a bridge closes"), Example("heavy rain", "floods")])
    return cfg.train.out_dir


def test_elf_tasks_run_end_to_end_from_a_checkpoint_and_agree_with_the_scorers(tiny_assets, scoring_lm, tmp_path):
    checkpoint = _checkpoint(tiny_assets, tmp_path)
    runs = {"xsum": ["--source", str(XSUM)], "wmt14-de-en": ["--source", str(WMT)],
            "owt-genppl": ["--limit", "3", "--ppl-model", str(scoring_lm[0])]}
    for task, flags in runs.items():
        out = tmp_path / task
        assert main(["eval", "--task", task, *flags, "--checkpoint", checkpoint, "--samples", "2", "--out", str(out),
                     "--no-progress"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        assert summary["complete"] and summary["n_seeds"] == 2 and len(preds) == 2 * summary["n_problems"]
        for j in range(2):
            hyps = [p["solution"] for p in preds if p["seed"] == j]
            refs = [r["reference"] for r in records if r["sample"] == j]
            got = summary["per_seed"][str(j)]
            if task == "xsum":
                assert got == pytest.approx(_rouge_direct(hyps, refs), rel=1e-12)
            elif task == "wmt14-de-en":
                assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, rel=1e-12)
            else:
                ppl, entropy = _direct_ppl([h for h in hyps if h.strip()], *scoring_lm[1:], 1024)
                assert got["gen_ppl"] == pytest.approx(ppl, rel=1e-5)
                assert got["entropy"] == pytest.approx(entropy, rel=1e-6)
        assert all(len(p["solution"]) <= 12 for p in preds)  # answers read from answer_cap tokens (characters)
