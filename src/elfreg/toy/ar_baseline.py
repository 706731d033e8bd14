"""``elfreg ar-baseline``: an autoregressive model of a toy student's size and training budget.

The inference-side question of ELF-REG (§4, App. C: prefix early-stop answers in few network
calls, in parallel) is only worth asking against the alternative a user has: a causal LM of the
same size, trained on the same data for the same budget, decoding greedily with its KV cache.
This module builds that model for a toy run config:

* the same parameter count as the config's student at inference (its REPA projector, which only
  training uses, left out): a ``Qwen3ForCausalLM`` of the student's width, depth and heads whose
  MLP width is chosen to bring its count nearest the student's (:func:`matched_lm_config`);
* the same training examples (the config's ``data`` section, :func:`~elfreg.toy.registry.toy_records`)
  and the same number of examples seen (``train.steps`` × ``train.batch_size``);
* the toy LMs' own pretraining (:func:`~elfreg.toy.lm.pretrain_lm`: AdamW, warm-up then cosine,
  prompt tokens down-weighted as the toy LMs' are);
* scored by greedy decoding on the config's held-out problems with the toy scorer, as the frozen
  teacher is in the demo's baselines.

Layout of ``--out``::

    .lock              held while it runs
    t<seed>/           one trained model: a hub-style folder (config, safetensors, tokenizer)
                       and ``ar_baseline.json`` (its settings, pretraining stats, pass@1)
    results.json       every seed's pass@1, with the config (rewritten after each seed)
    .resume-t<seed>.pt the unfinished seed's training state, every RESUME_EVERY steps (removed when done)

A seed whose folder is complete is reused; a killed run goes on from its seed's last resume state
(the weights and losses of a run never stopped) and leaves at most a temporary folder, which the
next run replaces.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from elfreg.config import Config, add_progress_flag
from elfreg.model.presets import student_from_config
from elfreg.plugins import resolve_model_id
from elfreg.runs import locked, write_json_atomic
from elfreg.text.load import load_frozen_text
from elfreg.text.tokenizer import load_tokenizer
from elfreg.toy.corpus import lm_prompt
from elfreg.toy.demo import heldout_problems
from elfreg.toy.lm import ToyLMConfig, greedy_generate, load_lm, pretrain_lm, qwen3_config, score_answer
from elfreg.toy.registry import toy_records
from elfreg.toy.seeds import parse_seeds

META_FILE = "ar_baseline.json"
PROMPT_LOSS_WEIGHT = 0.1
"""As the toy encoder and teacher (:data:`elfreg.toy.assets.DEFAULT_TEACHER`): prompts' names and
numbers are random, their tokens teach little about answering."""
AR_LR = 3e-3
"""The toy LMs' AdamW learning rate."""
RESUME_EVERY = 500
"""Steps between two resume states of a seed's training (a few minutes of a 16,000-step run)."""


def lm_params(cfg: ToyLMConfig, tokenizer) -> int:
    """Parameters of the ``Qwen3ForCausalLM`` that ``cfg`` describes (built on the meta device)."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3_config(cfg, tokenizer))
    return sum(p.numel() for p in model.parameters())


def student_inference_params(cfg: Config) -> int:
    """Parameters the config's student answers with (all of them but the training-only REPA
    projector), sized to its frozen models."""
    frozen = load_frozen_text(cfg.text, with_teacher=cfg.needs_teacher)
    teacher_dim = frozen.teacher.width if frozen.teacher is not None else None
    with torch.device("meta"):
        student = student_from_config(cfg, frozen.encoder.width, frozen.encoder.vocab_size, teacher_dim)
    return student.parameter_groups()["inference"]


def matched_lm_config(cfg: Config, target: int, tokenizer, seed: int) -> ToyLMConfig:
    """A causal LM of the student's width, depth and heads, with the MLP width (a multiple of 8)
    whose parameter count lies nearest ``target``; trained for the student's steps and batch.
    Refused when even the narrowest MLP has more parameters than ``target`` by over 10 %."""
    m = cfg.model
    base = ToyLMConfig(hidden_size=m.width, num_layers=m.depth, num_heads=m.heads, num_kv_heads=m.heads,
                       intermediate_size=8, steps=cfg.train.steps, batch_size=cfg.train.batch_size, lr=AR_LR,
                       warmup_steps=cfg.train.warmup_steps, seed=seed, prompt_loss_weight=PROMPT_LOSS_WEIGHT,
                       tie_embeddings=False)
    floor = lm_params(base, tokenizer)
    per_unit = (lm_params(replace(base, intermediate_size=16), tokenizer) - floor) / 8
    if floor > 1.1 * target:
        raise ValueError(f"a causal LM of width {m.width} and depth {m.depth} has at least {floor:,} parameters, "
                         f"over the student's {target:,}: the student is too small to match")
    size = max(8, 8 * round((target - floor) / per_unit / 8 + 1))
    return replace(base, intermediate_size=size)


def train_seed(cfg: Config, seed: int, out: Path, target: int, progress: bool) -> dict:
    """Train (or reuse) the AR baseline of ``seed`` into ``out / t<seed>`` and score it greedily on
    the held-out problems; returns its record."""
    final = out / f"t{seed}"
    if (final / META_FILE).exists():
        return json.loads((final / META_FILE).read_text())
    tokenizer = load_tokenizer(resolve_model_id(cfg.text.encoder))
    lm_cfg = matched_lm_config(cfg, target, tokenizer, seed)
    resume = out / f".resume-t{seed}.pt"
    model, stats = pretrain_lm(lm_cfg, tokenizer, toy_records(cfg.data), progress=progress, desc=f"AR t{seed}",
                               resume=resume, resume_every=RESUME_EVERY)
    tmp = out / f".tmp-t{seed}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    problems = heldout_problems(cfg)
    start = time.perf_counter()
    model, tokenizer = load_lm(tmp)  # scored exactly as it will be loaded again
    texts = greedy_generate(model, tokenizer, [lm_prompt(p) for p in problems],
                            max_new_tokens=cfg.text.canvas_len, batch_size=32)
    correct = [score_answer(p, t) for p, t in zip(problems, texts, strict=True)]
    record = {"seed": seed, "lm": lm_cfg.to_dict(), "student_params": target, "params": stats.params,
              "examples_seen": lm_cfg.steps * lm_cfg.batch_size, "pretrain": stats.__dict__,
              "pass@1": sum(correct) / len(correct), "n_problems": len(problems),
              "eval_seconds": round(time.perf_counter() - start, 2), "split": cfg.eval.split}
    text = json.dumps(record, indent=2) + "\n"
    (tmp / META_FILE).write_text(text)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    resume.unlink(missing_ok=True)
    return json.loads(text)  # as a reused seed returns it


def run_ar_baseline(cfg: Config, out: str | Path, seeds: list[int], progress: bool = True) -> dict:
    """Train and score the AR baseline of ``cfg`` for each of ``seeds`` into ``out`` (locked)."""
    out = Path(out)
    with locked(out, what="AR baseline folder"):
        target = student_inference_params(cfg)
        records = []
        for seed in seeds:
            records.append(train_seed(cfg, seed, out, target, progress))
            scores = [r["pass@1"] for r in records]
            summary = {"config": cfg.to_dict(), "student_params": target, "runs": records,
                       "pass@1_mean": statistics.fmean(scores), "pass@1_span": max(scores) - min(scores)}
            write_json_atomic(out / "results.json", summary)
        return summary


def run(args: argparse.Namespace) -> int:
    cfg = Config.load(args.config, args.override)
    summary = run_ar_baseline(cfg, args.out, parse_seeds(args.seeds), progress=not args.no_progress)
    for r in summary["runs"]:
        print(f"t{r['seed']}: pass@1 {100 * r['pass@1']:.1f} % on {r['n_problems']} problems "
              f"({r['params']:,} parameters, student {r['student_params']:,})")
    print(f"mean {100 * summary['pass@1_mean']:.1f} %, span {100 * summary['pass@1_span']:.1f} points; "
          f"wrote {Path(args.out) / 'results.json'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ar-baseline", help="train and score a causal LM of a toy student's size and budget")
    p.add_argument("--config", required=True, help="the toy student's run config (e.g. configs/toy-study-level2.yaml)")
    p.add_argument("--seeds", default="0", help="training seeds, e.g. 0-2 (default 0)")
    p.add_argument("--out", required=True, help="output folder")
    add_progress_flag(p)
    p.add_argument("override", nargs="*", help="key.sub=value overrides of the config")
    p.set_defaults(func=run)
