"""``elfreg demo``: the whole method on toy arithmetic, on a CPU, with no download.

1. build (or reuse) the toy tokenizer and the tiny frozen encoder/teacher LMs;
2. train an ELF-REG student (and with ``--compare`` the plain ELF baseline on the same budget)
   on one-step problems of the training split;
3. evaluate on held-out one-step problems whose number combinations never occur in training,
   with prefix early-stop and full-span at several NFE, pass@1 ± std over sampling seeds, scored
   by the GSM8K extractor;
4. print a table beside a trivial baseline (most frequent training answer), the untrained
   student and the teacher LM's greedy accuracy; write ``results.json`` (with the resolved
   configs), ``table.txt`` and ``pass1_vs_nfe.png`` into the output folder.

Training is resumable: running the same command again continues or reuses finished runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from elfreg.checkpoint import open_checkpoint, resolve_checkpoint
from elfreg.config import Config, build_dataclass
from elfreg.device import PRECISION_ENV, cpu_has_native_bf16, resolve_precision
from elfreg.eval.gsm8k import extract_gsm8k_answer, numbers_equal
from elfreg.model.presets import student_from_config
from elfreg.sampling import generate
from elfreg.text.load import load_frozen_text
from elfreg.toy import arith as toy_arith
from elfreg.toy.registry import as_example, toy_examples
from elfreg.toy.report import LEVEL_NAMES, format_table, write_outputs
from elfreg.train.loop import train


@dataclass
class DemoPlan:
    """Budgets of one demo run (the defaults are the full CPU demo; ``configs/toy-study-*.yaml``
    hold the longer study's plans)."""

    out_dir: str = "runs/demo"
    quick: bool = False
    compare: bool = False
    level: int = 1  # 1: one-step problems, 2: two or three chained steps
    steps: int = 2400
    batch_size: int = 32
    width: int = 128
    depth: int = 4
    lr: float = 3e-3
    canvas_len: int = 56
    prompt_cap: int = 32
    nfes: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    seeds: int = 3
    eval_limit: int = 0  # 0: every held-out problem
    heldout_split: str = "test"  # "valid" for tuning, so the test split stays untouched
    curve_points: int = 0  # held-out evaluations during training (early-stop, 16 NFE, one seed)
    sc_cfg: float = 1.0  # SC-CFG scale w at sampling (tuned on the valid split: docs/demo.md)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.heldout_split not in ("valid", "test"):
            raise ValueError(f"heldout_split must be 'valid' or 'test', got {self.heldout_split!r}")
        if self.level not in LEVEL_NAMES:
            raise ValueError(f"level must be 1 or 2, got {self.level}")
        if self.seeds < 1 or self.steps < 1 or not self.nfes or min(self.nfes) < 2:
            raise ValueError("a demo plan needs steps >= 1, seeds >= 1 and NFEs >= 2")
        if self.curve_points < 0 or self.eval_limit < 0:
            raise ValueError("curve_points and eval_limit must be >= 0")
        if self.sc_cfg <= 0:
            raise ValueError(f"sc_cfg must be > 0, got {self.sc_cfg}")

    @classmethod
    def quick_plan(cls, out_dir: str | Path) -> DemoPlan:
        return cls(out_dir=str(out_dir), quick=True, steps=150, batch_size=32, width=128, depth=2,
                   lr=2e-3, nfes=[4, 16], seeds=2, eval_limit=48, curve_points=2)

    @classmethod
    def from_file(cls, path: str | Path, **changes) -> DemoPlan:
        """A plan from a YAML mapping of its fields (unknown keys and wrong types fail)."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        return build_dataclass(cls, {**data, **changes}, prefix=f"{path}: ")


def demo_config(plan: DemoPlan, variant: str) -> Config:
    """The run config of one demo model (``variant``: ``elf-reg`` or ``elf``)."""
    scheme = "toy-quick" if plan.quick else "toy"
    reg = variant == "elf-reg"
    return Config.from_dict({
        "text": {"encoder": f"{scheme}:encoder", "encoder_layer": 2, "teacher": f"{scheme}:teacher",
                 "repa_layer": 1, "reg_layer": 2, "canvas_len": plan.canvas_len, "prompt_cap": plan.prompt_cap},
        "model": {"width": plan.width, "depth": plan.depth, "heads": max(1, plan.width // 64),
                  "repa_block": max(1, plan.depth // 2), "projector_hidden": 2 * plan.width,
                  "time_freq_dim": 64},
        "loss": {"repa": reg, "extra_token": "reg" if reg else "none"},
        "data": {"source": "toy-arith", "toy_level": plan.level, "toy_count": 20000},
        "train": {"steps": plan.steps, "batch_size": plan.batch_size, "lr": plan.lr,
                  "warmup_steps": min(100, plan.steps // 10), "out_dir": str(Path(plan.out_dir) / variant),
                  "ckpt_every": max(50, plan.steps // 10), "log_every": 10, "ema_decay": 0.99,
                  "feature_cache": True, "progress": plan.progress},
        "sample": {"sc_cfg": plan.sc_cfg},
    })


def heldout_problems(plan: DemoPlan) -> list[dict]:
    arith = toy_arith.ArithConfig(max_number=demo_config(plan, "elf").data.toy_max_number)
    problems = toy_arith.heldout(plan.heldout_split, plan.level, arith)
    return problems[: plan.eval_limit] if plan.eval_limit else problems


def pass1(texts: list[str], problems: list[dict]) -> float:
    correct = [numbers_equal(extract_gsm8k_answer(t), p["final"]) for t, p in zip(texts, problems, strict=True)]
    return sum(correct) / len(correct)


def token_match(tokens: list[int], gold: list[int]) -> float:
    """Share of the gold answer's positions (its EOS included) where the sample has the gold token:
    a graded closeness that moves long before whole answers come out right."""
    return sum(i < len(tokens) and tokens[i] == g for i, g in enumerate(gold)) / len(gold)


def evaluate(student, frozen, problems: list[dict], sampler: str, nfe: int, seeds: int, sc_cfg: float,
             progress: bool) -> dict:
    """pass@1 per sampling seed (sample j uses seed j) with mean ± std, and the token match."""
    prompts = [as_example(p).prompt for p in problems]
    tok = frozen.tokenizer
    gold = [tok(p["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for p in problems]
    results = generate(student, frozen, prompts, nfe=nfe, sampler=sampler, samples=seeds, seed=0,
                       sc_cfg=sc_cfg, batch_size=256, progress=progress)
    by_seed = [[r.text for r in results if r.sample_index == j] for j in range(seeds)]
    scores = [pass1(texts, problems) for texts in by_seed]
    matches = [token_match(r.tokens + [tok.eos_token_id], gold[r.prompt_index]) for r in results]
    return {"sampler": sampler, "nfe": nfe, "per_seed": scores, "mean": statistics.fmean(scores),
            "std": statistics.pstdev(scores), "token_match": statistics.fmean(matches),
            "nfe_used": statistics.fmean(r.nfe for r in results)}


def most_frequent_answer_accuracy(problems: list[dict], train_finals: list[str]) -> tuple[str, float]:
    answer = Counter(train_finals).most_common(1)[0][0]
    return answer, sum(p["final"] == answer for p in problems) / len(problems)


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train_variant(plan: DemoPlan, variant: str, problems: list[dict]) -> tuple[Config, Path, list[dict]]:
    """Train (or resume, or reuse) one demo model. With ``plan.curve_points`` the run stops at
    evenly spaced steps to score its EMA weights on ``problems`` (early-stop, 16 NFE, seed 0);
    each point is appended to ``accuracy_curve.jsonl`` in the run folder, with the training
    seconds spent so far, so a resumed run keeps its curve."""
    cfg = demo_config(plan, variant)
    run_dir = Path(cfg.train.out_dir)
    curve_path = run_dir / "accuracy_curve.jsonl"
    stops = sorted({round(cfg.train.steps * k / plan.curve_points) for k in range(1, plan.curve_points + 1)}
                   | {cfg.train.steps})
    for stop in stops:
        existing = resolve_checkpoint(run_dir)
        done = open_checkpoint(existing).meta["step"] if existing is not None else 0
        if done >= stop:
            continue
        curve = _read_jsonl(curve_path)
        start = time.perf_counter()
        train(cfg, stop_at=stop)
        seconds = (curve[-1]["train_seconds"] if curve else 0.0) + time.perf_counter() - start
        point = {"step": stop, "train_seconds": seconds}
        if plan.curve_points:
            frozen = load_frozen_text(cfg.text, with_teacher=False)
            student = open_checkpoint(run_dir).load_student(use_ema=True)
            point["pass@1"] = evaluate(student, frozen, problems, "early-stop", 16, 1, cfg.sample.sc_cfg,
                                       progress=False)["mean"]
        with open(curve_path, "a") as f:
            f.write(json.dumps(point) + "\n")
    return cfg, run_dir, _read_jsonl(curve_path)


def precision_report() -> dict:
    """The precision the demo runs in (every part follows ``precision: auto``) and why."""
    forced = os.environ.get(PRECISION_ENV, "")
    return {"resolved": resolve_precision("cpu"), "forced_by": f"{PRECISION_ENV}={forced}" if forced else None,
            "cpu_native_bf16": cpu_has_native_bf16()}


def run_demo(plan: DemoPlan) -> dict:
    from elfreg.toy.assets import build_toy_assets
    from elfreg.toy.lm import greedy_accuracy

    out_dir = Path(plan.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    assets = build_toy_assets(quick=plan.quick, progress=plan.progress)
    problems = heldout_problems(plan)
    variants = ["elf-reg", "elf"] if plan.compare else ["elf-reg"]
    report: dict = {"plan": dict(plan.__dict__), "precision": precision_report(),
                    "toy_assets": str(assets.root),
                    "asset_report": assets.report, "n_test_problems": len(problems), "models": {}}

    cfg0 = demo_config(plan, "elf-reg")
    finals = [extract_gsm8k_answer(e.answer) for e in toy_examples(cfg0.data)]
    answer, acc = most_frequent_answer_accuracy(problems, finals)
    report["baselines"] = {"most_frequent_answer": {"answer": answer, "pass@1": acc},
                           "teacher_greedy": {"pass@1": greedy_accuracy(assets.teacher_dir, problems)},
                           "encoder_lm_greedy": {"pass@1": greedy_accuracy(assets.encoder_dir, problems)}}

    for variant in variants:
        cfg, run_dir, curve = train_variant(plan, variant, problems)
        ckpt = open_checkpoint(run_dir)
        frozen = load_frozen_text(cfg.text, with_teacher=False)
        student = ckpt.load_student(use_ema=True)
        t_eval = time.perf_counter()
        rows = [evaluate(student, frozen, problems, s, n, plan.seeds, cfg.sample.sc_cfg, plan.progress)
                for s in ("early-stop", "full-span") for n in plan.nfes]
        eval_seconds = time.perf_counter() - t_eval
        torch.manual_seed(0)
        untrained = student_from_config(cfg, student.enc_dim, student.vocab_size, student.teacher_dim).eval()
        untrained_row = evaluate(untrained, frozen, problems, "early-stop", 16, plan.seeds, cfg.sample.sc_cfg,
                                 plan.progress)
        report["models"][variant] = {
            "config": cfg.to_dict(), "checkpoint": str(ckpt.path),
            "train_seconds": curve[-1]["train_seconds"] if curve else 0.0, "eval_seconds": eval_seconds,
            "results": rows, "untrained": untrained_row,
            "accuracy_curve": [p for p in curve if "pass@1" in p],
            "learning_curve": _read_jsonl(run_dir / "metrics.jsonl")}
    report["total_seconds"] = time.perf_counter() - t0
    report["outputs"] = [str(p) for p in write_outputs(out_dir, report)]
    return report


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.plan:
        plan = DemoPlan.from_file(args.plan, out_dir=str(out))
    else:
        plan = DemoPlan.quick_plan(out) if args.quick else DemoPlan(out_dir=str(out))
    changes = {"compare": plan.compare or args.compare, "progress": not args.no_progress}
    if args.steps:
        changes["steps"] = args.steps
    plan = dataclasses.replace(plan, **changes)  # re-runs the plan's checks
    report = run_demo(plan)
    print(format_table(report))
    print(f"\nwrote {', '.join(report['outputs'])} ({report['total_seconds']:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train and evaluate ELF-REG on toy arithmetic (CPU, no download)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI-sized run (about 2 minutes)")
    mode.add_argument("--plan", help="YAML file of demo-plan fields (e.g. configs/toy-study-level2.yaml)")
    p.add_argument("--compare", action="store_true", help="also train the plain ELF baseline on the same budget")
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--steps", type=int, default=0, help="override the number of training steps")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)
