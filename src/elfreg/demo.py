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
import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import Config
from .data import toy_arith
from .data.toy import as_example, toy_examples
from .eval.gsm8k import extract_gsm8k_answer, numbers_equal
from .model.presets import student_from_config
from .sampling import generate
from .text.load import load_frozen_text
from .train.checkpoint import open_checkpoint, resolve_checkpoint
from .train.loop import train


@dataclass
class DemoPlan:
    """Budgets of one demo run (the defaults are the full CPU demo)."""

    out_dir: Path = Path("runs/demo")
    quick: bool = False
    compare: bool = False
    steps: int = 700
    batch_size: int = 64
    width: int = 192
    depth: int = 4
    lr: float = 1e-3
    nfes: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    seeds: int = 3
    eval_limit: int = 0  # 0: every held-out one-step problem
    progress: bool = True

    @classmethod
    def quick_plan(cls, out_dir: Path) -> DemoPlan:
        return cls(out_dir=out_dir, quick=True, steps=150, batch_size=32, width=128, depth=2,
                   lr=2e-3, nfes=[4, 16], seeds=2, eval_limit=48)


def demo_config(plan: DemoPlan, variant: str) -> Config:
    """The run config of one demo model (``variant``: ``elf-reg`` or ``elf``)."""
    scheme = "toy-quick" if plan.quick else "toy"
    reg = variant == "elf-reg"
    return Config.from_dict({
        "text": {"encoder": f"{scheme}:encoder", "encoder_layer": 2, "teacher": f"{scheme}:teacher",
                 "repa_layer": 1, "reg_layer": 2, "canvas_len": 56, "prompt_cap": 32},
        "model": {"width": plan.width, "depth": plan.depth, "heads": max(1, plan.width // 64),
                  "repa_block": max(1, plan.depth // 2), "projector_hidden": 2 * plan.width,
                  "time_freq_dim": 64},
        "loss": {"repa": reg, "extra_token": "reg" if reg else "none"},
        "data": {"source": "toy-arith", "toy_level": 1, "toy_count": 20000},
        "train": {"steps": plan.steps, "batch_size": plan.batch_size, "lr": plan.lr,
                  "warmup_steps": min(100, plan.steps // 10), "out_dir": str(plan.out_dir / variant),
                  "ckpt_every": max(50, plan.steps // 10), "log_every": 10, "ema_decay": 0.99,
                  "progress": plan.progress},
        "sample": {"sc_cfg": 1.0},
    })


def heldout_problems(plan: DemoPlan) -> list[dict]:
    arith = toy_arith.ArithConfig(max_number=demo_config(plan, "elf").data.toy_max_number)
    problems = toy_arith.heldout("test", 1, arith)
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


def train_variant(plan: DemoPlan, variant: str) -> tuple[Config, Path, float]:
    cfg = demo_config(plan, variant)
    existing = resolve_checkpoint(cfg.train.out_dir)
    start = time.perf_counter()
    if existing is None or open_checkpoint(existing).meta["step"] < cfg.train.steps:
        train(cfg)
    return cfg, Path(cfg.train.out_dir), time.perf_counter() - start


def run_demo(plan: DemoPlan) -> dict:
    from .data.toy_assets import build_toy_assets
    from .data.toy_lm import greedy_accuracy

    plan.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    assets = build_toy_assets(quick=plan.quick, progress=plan.progress)
    problems = heldout_problems(plan)
    variants = ["elf-reg", "elf"] if plan.compare else ["elf-reg"]
    report: dict = {"plan": {k: (str(v) if isinstance(v, Path) else v) for k, v in plan.__dict__.items()},
                    "toy_assets": str(assets.root), "n_test_problems": len(problems), "models": {}}

    cfg0 = demo_config(plan, "elf-reg")
    finals = [extract_gsm8k_answer(e.answer) for e in toy_examples(cfg0.data)]
    answer, acc = most_frequent_answer_accuracy(problems, finals)
    report["baselines"] = {"most_frequent_answer": {"answer": answer, "pass@1": acc},
                           "teacher_greedy": {"pass@1": greedy_accuracy(assets.teacher_dir, problems)},
                           "encoder_lm_greedy": {"pass@1": greedy_accuracy(assets.encoder_dir, problems)}}

    for variant in variants:
        cfg, run_dir, seconds = train_variant(plan, variant)
        ckpt = open_checkpoint(run_dir)
        frozen = load_frozen_text(cfg.text, with_teacher=False)
        student = ckpt.load_student(use_ema=True)
        rows = [evaluate(student, frozen, problems, s, n, plan.seeds, cfg.sample.sc_cfg, plan.progress)
                for s in ("early-stop", "full-span") for n in plan.nfes]
        torch.manual_seed(0)
        untrained = student_from_config(cfg, student.enc_dim, student.vocab_size, student.teacher_dim).eval()
        untrained_row = evaluate(untrained, frozen, problems, "early-stop", 16, plan.seeds, cfg.sample.sc_cfg,
                                 plan.progress)
        report["models"][variant] = {"config": cfg.to_dict(), "checkpoint": str(ckpt.path),
                                     "train_seconds": seconds, "results": rows, "untrained": untrained_row,
                                     "learning_curve": _curve(run_dir)}
    report["total_seconds"] = time.perf_counter() - t0
    write_outputs(plan.out_dir, report)
    return report


def _curve(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def format_table(report: dict) -> str:
    b = report["baselines"]
    lines = [f"held-out one-step problems (unseen number combinations): {report['n_test_problems']}",
             f"most frequent answer ({b['most_frequent_answer']['answer']}): "
             f"{100 * b['most_frequent_answer']['pass@1']:.1f}%",
             f"teacher LM greedy: {100 * b['teacher_greedy']['pass@1']:.1f}%   "
             f"encoder LM greedy: {100 * b['encoder_lm_greedy']['pass@1']:.1f}%", ""]
    for variant, m in report["models"].items():
        u = m["untrained"]
        best = max(m["results"], key=lambda r: r["token_match"])
        lines.append(f"{variant} (trained {m['train_seconds']:.0f} s; untrained at 16 NFE: {100 * u['mean']:.1f}%, "
                     f"token match {100 * u['token_match']:.0f}% vs trained {100 * best['token_match']:.0f}%)")
        lines.append(f"  {'sampler':<11} " + " ".join(f"{'NFE ' + str(r['nfe']):>14}"
                                                      for r in m["results"] if r["sampler"] == "early-stop"))
        for sampler in ("early-stop", "full-span"):
            cells = [f"{100 * r['mean']:6.1f} ± {100 * r['std']:4.1f}" for r in m["results"] if r["sampler"] == sampler]
            lines.append(f"  {sampler:<11} " + " ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def write_outputs(out_dir: Path, report: dict) -> None:
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    (out_dir / "table.txt").write_text(format_table(report) + "\n")
    plot_pass1_vs_nfe(report, out_dir / "pass1_vs_nfe.png")


def plot_pass1_vs_nfe(report: dict, path: Path) -> None:
    import os

    from .paths import cache_dir

    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))  # keep its font cache ours
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for variant, m in report["models"].items():
        for sampler, style in (("early-stop", "-o"), ("full-span", "--s")):
            rows = [r for r in m["results"] if r["sampler"] == sampler]
            ax.errorbar([r["nfe"] for r in rows], [100 * r["mean"] for r in rows],
                        yerr=[100 * r["std"] for r in rows], fmt=style, capsize=3, label=f"{variant} {sampler}")
    ax.axhline(100 * report["baselines"]["teacher_greedy"]["pass@1"], color="gray", ls=":", label="teacher LM greedy")
    ax.axhline(100 * report["baselines"]["most_frequent_answer"]["pass@1"], color="k", ls=":", lw=0.8,
               label="most frequent answer")
    ax.set_xscale("log", base=2)
    nfes = sorted({r["nfe"] for m in report["models"].values() for r in m["results"]})
    ax.set_xticks(nfes, [str(n) for n in nfes])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("NFE")
    ax.set_ylabel("pass@1 (%) on held-out one-step problems")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    plan = DemoPlan.quick_plan(out) if args.quick else DemoPlan(out_dir=out)
    plan.compare = args.compare
    plan.progress = not args.no_progress
    if args.steps:
        plan.steps = args.steps
    report = run_demo(plan)
    print(format_table(report))
    print(f"\nwrote {out / 'results.json'}, {out / 'table.txt'} and {out / 'pass1_vs_nfe.png'} "
          f"({report['total_seconds']:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train and evaluate ELF-REG on toy arithmetic (CPU, no download)")
    p.add_argument("--quick", action="store_true", help="CI-sized run (about 2 minutes)")
    p.add_argument("--compare", action="store_true", help="also train the plain ELF baseline on the same budget")
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--steps", type=int, default=0, help="override the number of training steps")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)
