"""``elfreg demo``: the whole method on toy arithmetic, on a CPU, with no download.

1. build (or reuse) the toy tokenizer and the tiny frozen encoder/teacher LMs;
2. train an ELF-REG student (and with ``--compare`` the plain ELF baseline on the same budget)
   on the training split of the toy task;
3. evaluate on held-out problems whose number combinations never occur in training, at every
   (sampler, NFE) pair of ``eval.samplers`` × ``eval.nfes``, pass@1 ± the sample std over
   ``eval.samples`` sampling seeds, scored by the GSM8K extractor;
4. print a table beside a trivial baseline (most frequent training answer), the untrained
   student (one sampling seed: it scores nothing, and a second seed would cost time, not
   information) and the frozen LMs' greedy accuracy (scored by the same extractor); write
   ``results.json`` (with the resolved config), ``table.txt`` and the figures into ``--out``.

The demo's settings are an ordinary run config (:func:`demo_config`, or ``--config FILE`` such as
``configs/toy-study-level1.yaml``) whose ``eval`` section says what to measure; ``key=value``
overrides work as for ``elfreg train``. Training is resumable: running the same command again
continues or reuses finished runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

from elfreg.checkpoint import open_checkpoint, resolve_checkpoint
from elfreg.compiling import compile_problem
from elfreg.config import Config, SampleConfig, add_progress_flag, apply_config_overrides
from elfreg.device import PRECISION_ENV, cpu_has_native_bf16, resolve_device, resolve_precision
from elfreg.eval.passk import summarize
from elfreg.jsonl import append_jsonl, read_jsonl
from elfreg.model.presets import student_from_config
from elfreg.plugins import resolve_model_id
from elfreg.runs import locked, write_json_atomic
from elfreg.sampling import generate
from elfreg.text.load import FrozenText, load_frozen_text
from elfreg.toy import arith
from elfreg.toy.lm import greedy_accuracy
from elfreg.toy.registry import as_example, toy_examples
from elfreg.toy.report import format_table, write_outputs
from elfreg.toy.seeds import format_spread, parse_seeds, run_seeds
from elfreg.train.loop import train

# The default recipe (docs/demo.md; docs/records/2026-12-06-toy-recipe-64-wide.md): a 64-wide,
# 4-block student, 5,800 steps of 32 with ELF's Muon at lr 1e-2 and weight decay 0.2, training
# problems drawn evenly over the tens digit of their result, with the feature cache. This task is
# learnt in a late jump from reproducing the answers' form to computing their numbers; a run's
# score was where it stood on that rise when the budget ran out (a 128-wide student at 2,400
# steps: five seeds 9.9 points apart, all still rising). The examples a run sees, more than its
# steps, carry that learning (batches of 16 or 24 brought the spread back), and a narrower student
# sees them for less arithmetic: an 80-wide student at 5,200 steps put five seeds within 2.3
# points, but the demo took about 16 minutes; a 64-wide step takes 0.76x the time (the demo 12 min
# 55 s at 5,200 steps), and at 5,200 steps one seed in four was still rising (86.6 / 89.7 / 92.1 %
# at steps 4,400 / 4,800 / 5,200), so it trains 600 steps more. A higher learning rate at the
# same lr x decay finishes slow runs sooner (an 80-wide seed: 91.9 % at 5e-3, 99.3 % at 1e-2).
# Draws balanced over the tens digit remove the runs that stop short on results in the 50s (4.7 %
# of uniform draws). Decay brings the jump forward (valid pass@1 at 1,500 steps, lr 2e-3: 34 %
# without decay, 70 % at 1.0). The SC-CFG scale is drawn from [0.5, 2] in training, not the
# paper's [0.5, 5]: with the auxiliary predictions at the row's w, learning the strongly
# extrapolated targets of w up to 5 cost an earlier student 44 points on the valid split; sampling
# at w = 1, 2 or 3 scores alike. The blocks are compiled (train.compile): a step takes 0.86x the
# time after about 17 s of compiling (benchmarks/train_compile_ab.py, AVX2 kernels); where
# torch.compile cannot run, the demo trains without it and says so (compile_where_possible).
DEMO = {
    "text": {"encoder": "toy:encoder", "encoder_layer": 2, "teacher": "toy:teacher", "repa_layer": 1,
             "reg_layer": 2, "canvas_len": 56, "prompt_cap": 32},
    "model": {"width": 64, "depth": 4, "heads": 2, "repa_block": 2, "projector_hidden": 128, "time_freq_dim": 64},
    "flow": {"w_max": 2.0},
    "data": {"source": "toy-arith", "toy_level": 1, "toy_count": 20000, "toy_balance": "tens"},
    "train": {"steps": 5800, "batch_size": 32, "optimizer": "muon", "lr": 1e-2, "schedule": "cosine",
              "weight_decay": 0.2, "warmup_steps": 100, "ckpt_every": 400, "log_every": 10,
              "ema_decay": 0.99, "feature_cache": True, "compile": True},
    "sample": {"sc_cfg": 1.0},
    "eval": {"samples": 2, "nfes": [4, 8, 16], "samplers": ["early-stop", "full-span"], "split": "test"},
}
# CI size: the quick toy LMs, a 96-wide 2-block student, 150 steps, 48 problems. AdamW without
# decay: in 150 steps the default's Muon does not yet move the token match off zero. 96 wide, not
# the default's width: in 150 steps an 80-wide student's token match rose 3 points over the
# untrained one's, too close to the quick test's floor; the 96-wide one's rose 6. Not compiled:
# compiling takes longer than 150 steps of this student.
QUICK = {
    "text": {"encoder": "toy-quick:encoder", "teacher": "toy-quick:teacher"},
    "model": {"width": 96, "depth": 2, "repa_block": 1, "projector_hidden": 192},
    "train": {"steps": 150, "optimizer": "adamw", "lr": 2e-3, "weight_decay": 0.0, "warmup_steps": 15,
              "ckpt_every": 50, "compile": False},
    "eval": {"samples": 2, "nfes": [4, 16], "limit": 48, "curve_points": 2},
}
# What the untrained student, the learning curve and the seen combinations are measured with.
CURVE_SAMPLER = SampleConfig(sampler="early-stop", nfe=16)
SEEN_COUNT = 128
"""Training-split problems scored beside the held-out ones (at most as many as those)."""


def curve_sample(cfg: Config) -> SampleConfig:
    """The run's sampler settings with :data:`CURVE_SAMPLER`'s sampler and NFE."""
    return cfg.sample.replace(sampler=CURVE_SAMPLER.sampler, nfe=CURVE_SAMPLER.nfe)


def eval_batch_size(device: torch.device) -> int:
    """Rows per sampling batch of a toy evaluation. On a CPU, calls of more than about 32 rows
    run slower per row (their activations leave the caches: a level-2 denoise call took 1.9× as
    long per row at 256 rows as at 32, docs/performance.md); an answer does not depend on its
    batch on a CPU, so only the time changes. Elsewhere large batches are what keep a device busy."""
    return 32 if device.type == "cpu" else 256


def _merge(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for section, values in changes.items():
        out.setdefault(section, {}).update(values)
    return out


def demo_config(quick: bool = False, path: str | None = None, overrides: list[str] | None = None) -> Config:
    """The ELF-REG run config of a demo: the default (or ``quick``) preset, or a YAML file, with
    ``key=value`` overrides; validated."""
    if path is not None:
        return Config.load(path, overrides)
    data = _merge(DEMO, QUICK) if quick else copy.deepcopy(DEMO)
    apply_config_overrides(data, overrides)
    return Config.from_dict(data)


def compile_where_possible(cfg: Config) -> Config:
    """``cfg``, with ``train.compile`` turned off, and a warning saying why, where it asks for
    ``torch.compile`` and that cannot run here (:func:`elfreg.compiling.compile_problem`; e.g. no
    C++ compiler). The demo then trains eager: slower, its numbers rounded otherwise, its expected
    result the same (docs/demo.md); the config written with the results says which ran."""
    if not cfg.train.compile or (problem := compile_problem()) is None:
        return cfg
    warnings.warn(f"torch.compile cannot run here ({problem}); the demo trains without it (train.compile=false): "
                  "slower, same expected result", stacklevel=2)
    data = cfg.to_dict()
    data["train"]["compile"] = False
    return Config.from_dict(data)


def variant_config(cfg: Config, variant: str, out_dir: Path, progress: bool = True) -> Config:
    """``cfg`` as the ``elf-reg`` model or the plain ``elf`` baseline (REPA and REG off; the
    teacher is then never loaded), training into ``out_dir/variant``."""
    data = cfg.to_dict()
    if variant == "elf":
        data["model"].update(repa=False, extra_token="none")
    elif variant != "elf-reg":
        raise ValueError(f"unknown demo variant {variant!r}")
    data["train"].update(out_dir=str(out_dir / variant), progress=progress)
    return Config.from_dict(data)


def heldout_problems(cfg: Config) -> list[dict]:
    arith_cfg = arith.ArithConfig(max_number=cfg.data.toy_max_number)
    problems = arith.heldout(cfg.eval.split, cfg.data.toy_level, arith_cfg)
    return problems[: cfg.eval.limit] if cfg.eval.limit else problems


def token_match(tokens: list[int], gold: list[int]) -> float:
    """Share of the gold answer's positions (its EOS included) where the sample has the gold token:
    a graded closeness that moves long before whole answers come out right."""
    return sum(i < len(tokens) and tokens[i] == g for i, g in enumerate(gold)) / len(gold)


def evaluate(student, frozen: FrozenText, problems: list[dict], cfg: Config, sample: SampleConfig, samples: int,
             progress: bool, seed: int = 0) -> dict:
    """pass@1 over problems and ``samples`` sampling seeds (sample j uses seed ``seed + j``), with
    the sample std across seeds (:func:`elfreg.eval.passk.summarize`), and the token match."""
    tok = frozen.tokenizer
    gold = [tok(p["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for p in problems]
    results = generate(student, [as_example(p).prompt for p in problems], sample, frozen_text=frozen, flow=cfg.flow,
                       samples=samples, seed=seed, batch_size=eval_batch_size(next(student.parameters()).device),
                       progress=progress)
    verdicts: dict[str, list[bool]] = {str(i): [] for i in range(len(problems))}
    for r in results:  # prompt-major, sample j in order
        verdicts[str(r.prompt_index)].append(arith.is_correct(r.text, problems[r.prompt_index]))
    stats = summarize(verdicts)
    matches = [token_match(r.tokens + [tok.eos_token_id], gold[r.prompt_index]) for r in results]
    row = {"sampler": sample.sampler, "nfe": sample.nfe, "problems": len(problems), "per_seed": stats["per_seed"],
           "mean": stats["pass@1"],
           "std": stats["pass@1_std"], "token_match": statistics.fmean(matches),
           "nfe_used": statistics.fmean(r.nfe for r in results)}
    if all(p["level"] == 1 for p in problems):
        row["errors"] = error_shares([arith.error_kind(r.text, problems[r.prompt_index]) for r in results])
    return row


def error_shares(kinds: list[str | None]) -> dict[str, float]:
    """Share of the wrong answers (``None`` is a right one) of each kind of
    :data:`elfreg.toy.arith.ERROR_KINDS` that occurs; empty when none is wrong."""
    wrong = Counter(k for k in kinds if k is not None)
    total = sum(wrong.values())
    return {k: wrong[k] / total for k in arith.ERROR_KINDS if wrong[k]}


def seen_problems(cfg: Config, count: int) -> list[dict]:
    """``count`` problems of the training split at the demo's level (fixed wordings, seed 0): the
    number combinations the student trained on. Scoring them beside the held-out ones separates
    a student that has not learnt its training data from one that does not carry it over."""
    return arith.sample("train", cfg.data.toy_level, count, seed=0,
                        cfg=arith.ArithConfig(max_number=cfg.data.toy_max_number))


def train_variant(cfg: Config, problems: list[dict]) -> list[dict]:
    """Train (or resume, or reuse) one demo model. With ``eval.curve_points`` the run stops at
    evenly spaced steps to score its EMA weights on ``problems`` (early-stop, 16 NFE, seed 0);
    each point is appended to ``accuracy_curve.jsonl`` in the run folder, with the training
    seconds spent so far, so a resumed run keeps its curve. A stop whose scoring was cut off is
    noted in ``accuracy_curve.pending.json`` and scored on resume before any further training, so
    no point is lost. Returns the curve."""
    run_dir = Path(cfg.train.out_dir)
    curve_path = run_dir / "accuracy_curve.jsonl"
    pending_path = run_dir / "accuracy_curve.pending.json"
    points = cfg.eval.curve_points
    stops = sorted({round(cfg.train.steps * k / points) for k in range(1, points + 1)} | {cfg.train.steps})
    for stop in stops:
        curve = read_jsonl(curve_path, missing_ok=True)
        if any(p["step"] == stop for p in curve):
            continue
        point = json.loads(pending_path.read_text()) if pending_path.exists() else None
        if point is None or point["step"] != stop:
            existing = resolve_checkpoint(run_dir)
            if existing is not None and open_checkpoint(existing).meta["step"] >= stop:
                continue
            start = time.perf_counter()
            train(cfg, stop_at=stop)
            point = {"step": stop, "train_seconds": (curve[-1]["train_seconds"] if curve else 0.0)
                     + time.perf_counter() - start}
            if points:
                write_json_atomic(pending_path, point)
        if points:
            frozen = load_frozen_text(cfg.text, with_teacher=False)
            student = open_checkpoint(run_dir / "checkpoints" / f"step-{stop:07d}").load_student(use_ema=True)
            point["pass@1"] = evaluate(student, frozen, problems, cfg, curve_sample(cfg), 1, progress=False)["mean"]
        append_jsonl(curve_path, point)
        pending_path.unlink(missing_ok=True)
    return read_jsonl(curve_path, missing_ok=True)


def precision_report(cfg: Config) -> dict:
    """The device and precision the student trains and samples in, the precision of the toy LMs
    (always built on the CPU), and why."""
    forced = os.environ.get(PRECISION_ENV, "")
    device = resolve_device(cfg.train.device)
    return {"resolved": resolve_precision(device, cfg.train.precision), "device": device.type,
            "toy_lms": resolve_precision("cpu"), "forced_by": f"{PRECISION_ENV}={forced}" if forced else None,
            "cpu_native_bf16": cpu_has_native_bf16()}


def baselines(cfg: Config, problems: list[dict]) -> dict:
    """Most frequent training answer, and the frozen LMs' greedy accuracy, all scored by
    :func:`elfreg.toy.arith.is_correct` like the student."""
    finals = Counter(arith.final_answer(e.answer) for e in toy_examples(cfg.data))
    answer = finals.most_common(1)[0][0]
    frequent = sum(arith.is_correct(answer, p) for p in problems) / len(problems)
    return {"most_frequent_answer": {"answer": answer, "pass@1": frequent},
            "teacher_greedy": {"pass@1": greedy_accuracy(resolve_model_id(cfg.text.teacher), problems)},
            "encoder_lm_greedy": {"pass@1": greedy_accuracy(resolve_model_id(cfg.text.encoder), problems)}}


def run_demo(cfg: Config, out_dir: str | Path, compare: bool = False, progress: bool = True) -> dict:
    """Run the demo into ``out_dir``, which stays locked while it runs (a second demo or study
    into the same folder refuses)."""
    with locked(out_dir, what="demo folder"):
        return _run_demo(cfg, Path(out_dir), compare, progress)


def _run_demo(cfg: Config, out_dir: Path, compare: bool, progress: bool) -> dict:
    t0 = time.perf_counter()
    problems = heldout_problems(cfg)
    report: dict = {"config": cfg.to_dict(), "compare": compare, "precision": precision_report(cfg),
                    "toy_assets": str(Path(resolve_model_id(cfg.text.encoder)).parent),
                    "n_test_problems": len(problems), "baselines": baselines(cfg, problems), "models": {}}
    report["asset_report"] = json.loads((Path(report["toy_assets"]) / "report.json").read_text())
    for variant in ["elf-reg", "elf"] if compare else ["elf-reg"]:
        vcfg = variant_config(cfg, variant, out_dir, progress)
        curve = train_variant(vcfg, problems)
        ckpt = open_checkpoint(vcfg.train.out_dir)
        frozen = load_frozen_text(vcfg.text, with_teacher=False)
        student = ckpt.load_student(use_ema=True)
        t_eval = time.perf_counter()
        rows = [evaluate(student, frozen, problems, vcfg, s, cfg.eval.samples, progress)
                for s in cfg.eval.grid(cfg.sample)]
        eval_seconds = time.perf_counter() - t_eval
        torch.manual_seed(0)
        untrained = student_from_config(vcfg, student.enc_dim, student.vocab_size, student.teacher_dim).eval()
        report["models"][variant] = {
            "config": vcfg.to_dict(), "checkpoint": str(ckpt.path),
            "train_seconds": curve[-1]["train_seconds"] if curve else 0.0, "eval_seconds": eval_seconds,
            "results": rows,
            "untrained": evaluate(untrained, frozen, problems, vcfg, curve_sample(cfg), 1, progress),
            "seen": evaluate(student, frozen, seen_problems(cfg, min(len(problems), SEEN_COUNT)), vcfg,
                             curve_sample(cfg), 1, progress=False),
            "accuracy_curve": [p for p in curve if "pass@1" in p],
            "learning_curve": read_jsonl(Path(vcfg.train.out_dir) / "metrics.jsonl", missing_ok=True)}
    report["total_seconds"] = time.perf_counter() - t0
    report["outputs"] = [str(p) for p in write_outputs(out_dir, report)]
    return report


def run(args: argparse.Namespace) -> int:
    cfg = compile_where_possible(demo_config(args.quick, args.config, args.override))
    if args.seeds:
        if any(item.startswith("train.seed=") for item in args.override):
            raise ValueError("--seeds and a train.seed= override both set the training seed: give one")
        summary = run_seeds(cfg, args.out, args.seeds, compare=args.compare, progress=not args.no_progress)
        print(format_spread(summary["rows"]))
        print(f"\nwrote {', '.join(summary['outputs'])} and one demo folder per seed")
        return 0
    report = run_demo(cfg, args.out, compare=args.compare, progress=not args.no_progress)
    print(format_table(report))
    print(f"\nwrote {', '.join(report['outputs'])} ({report['total_seconds']:.0f} s)")
    return 0


def _seed_list(text: str) -> list[int]:
    try:
        return parse_seeds(text)
    except ValueError as err:  # argparse would print only "invalid value"
        raise argparse.ArgumentTypeError(str(err).removeprefix("--seeds: ")) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train and evaluate ELF-REG on toy arithmetic (CPU, no download)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI-sized run (about 2 minutes)")
    mode.add_argument("--config", help="a run config with an eval section (e.g. configs/toy-study-level1.yaml)")
    p.add_argument("--compare", action="store_true", help="also train the plain ELF baseline on the same budget")
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--seeds", type=_seed_list, metavar="LIST",
                   help="training seeds, e.g. 1-5 or 1,3,7: train once per seed into OUT/seed-S and write "
                        "the runs' spread and learning curves together (seeds.txt, seeds.json, seed_curves.png)")
    add_progress_flag(p)
    p.add_argument("override", nargs="*", help="key.sub=value overrides, e.g. train.steps=600 eval.samples=1")
    p.set_defaults(func=run)
