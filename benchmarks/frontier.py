"""Accuracy against speed on the toy chains: every (model, sampler, NFE) of a study beside an
autoregressive model of the student's size and budget, timed side by side in one run.

    python benchmarks/frontier.py --plan configs/study-toy-level2.yaml --study runs/study-toy-level2 \\
        --ar runs/ar-toy-level2 --out docs/performance/frontier
    python benchmarks/frontier.py --quick --out /tmp/frontier-quick    # tiny models it trains itself

pass@1 is read, not sampled again: each study point is the study's own table entry (mean over
its training and sampling seeds on the whole held-out set, ``elfreg study --report``), the AR
baseline's is the mean over its seeds (``elfreg ar-baseline``'s ``results.json``), and the frozen
toy teacher, the second reference, is decoded greedily here. Speed is measured here, for each
batch size: seconds per problem over the first ``--timing-problems`` held-out problems (prompt
encoding, every network call and the decoding into text included), with the first training seed's
weights of each model (a call costs the same whatever the weights), every case timed interleaved
with every other (``perf.common.interleaved``: the median of ``--repeats`` rounds), on one CPU,
thread count and precision. An answer does not depend on its batch on a CPU, so one pass@1 serves
every batch size.

A study that distils (its plan's ``distill`` section, docs/distillation.md) adds its distilled
students as the model ``<model>-distilled`` at N + 1 NFE per round, and their teachers at those
NFE where the main grid has no entry, read from the study's distilled table and timed with each
round's first-seed checkpoint: the distilled points beside early-stop at the same calls.

Beside the timings, the positions each problem's network calls process: calls × canvas rows for
the flow model (every call reads the whole canvas), prompt + one position per generated token for
the AR model (its KV cache keeps what it has read). Their ratio is why one is ahead of the other.

Writes ``frontier.json`` (settings, machine, every row, the summary), ``frontier.md`` (the tables)
and ``frontier-batch<B>.png`` (pass@1 against seconds per problem, one figure per batch size).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from elfreg.checkpoint import open_checkpoint
from elfreg.plugins import resolve_model_id
from elfreg.sampling import generate
from elfreg.text.load import load_frozen_text
from elfreg.toy.ar_baseline import run_ar_baseline
from elfreg.toy.corpus import lm_prompt
from elfreg.toy.demo import demo_config, heldout_problems
from elfreg.toy.lm import greedy_generate, load_lm, score_answer
from elfreg.toy.registry import as_example
from elfreg.toy.study.plan import DistilledCell, EvalCell, Study, load_plan
from elfreg.toy.study.runner import distill_dir, report_so_far, run_dir, run_study
from elfreg.train.distill import round_folder

from perf.common import interleaved, write_report

WITHIN = 0.01
"""A setting counts as matching a model's best accuracy when it is within one point of it."""


TIMING_ONLY = ("lm_dir", "checkpoint", "sample")
"""What a point carries for its timing alone, not into the rows."""


def _point(model: str, e: dict, checkpoint: Path, sample: Any) -> dict[str, Any]:
    return {"model": model, "sampler": e["sampler"], "nfe": e["nfe"], "pass@1": e["pass@1"],
            "train_seeds": e["n_train_seeds"], "sample_seeds": e["n_sample_seeds"], "checkpoint": checkpoint,
            "sample": sample}


def study_points(study: Study, out: Path) -> list[dict[str, Any]]:
    """Every finished (model, sampler, NFE) entry of the study's table, then of its distilled
    table (a teacher's entry only where the main table has none), each with the first training
    seed's checkpoint and the sample settings it is timed with."""
    report = report_so_far(study, out)
    first = study.plan.train_seeds[0]
    points = []
    for e in report["table"]:
        if e["pass@1"] is not None:
            cell = EvalCell(e["model"], first, e["sampler"], e["nfe"], 0)
            points.append(_point(e["model"], e, run_dir(out, cell.train_cell), study.sample_config(cell)))
    seen = {(p["model"], p["sampler"], p["nfe"]) for p in points}
    for e in report.get("distilled", []):
        cell = DistilledCell(e["model"], first, e["steps"], e["student"] == "distilled", e["sampler"], 0)
        model = f"{e['model']}-distilled" if cell.distilled else e["model"]
        if e["pass@1"] is None or (model, e["sampler"], e["nfe"]) in seen:
            continue
        checkpoint = run_dir(out, cell.train_cell)
        if cell.distilled:
            cfg = study.distill_config(cell.train_cell, distill_dir(out, cell.train_cell), progress=False)
            checkpoint = round_folder(cfg, study.distill_steps.index(cell.steps) + 1, cell.steps)
        points.append({**_point(model, e, checkpoint, study.distilled_sample_config(cell)),
                       "distilled_steps": cell.steps if cell.distilled else None})
    return points


def ar_point(ar_dir: Path) -> dict[str, Any]:
    results = json.loads((ar_dir / "results.json").read_text())
    runs = results["runs"]
    return {"model": "ar", "sampler": "greedy", "nfe": None, "pass@1": results["pass@1_mean"],
            "train_seeds": len(runs), "sample_seeds": 1, "params": runs[0]["params"],
            "student_params": results["student_params"], "lm_dir": str(ar_dir / f"t{runs[0]['seed']}")}


def teacher_point(study: Study, problems: list[dict]) -> dict[str, Any]:
    lm_dir = resolve_model_id(study.base.text.teacher)
    model, tokenizer = load_lm(lm_dir)
    texts = greedy_generate(model, tokenizer, [lm_prompt(p) for p in problems],
                            max_new_tokens=study.base.text.canvas_len, batch_size=32)
    correct = [score_answer(p, t) for p, t in zip(problems, texts, strict=True)]
    return {"model": "teacher", "sampler": "greedy", "nfe": None, "pass@1": sum(correct) / len(correct),
            "train_seeds": 1, "sample_seeds": 1, "params": sum(p.numel() for p in model.parameters()),
            "lm_dir": lm_dir}


def timing_cases(study: Study, points: list[dict], problems: list[dict], batch: int
                 ) -> tuple[dict[str, Any], dict[str, dict]]:
    """One callable per point at ``batch`` rows (or AR sequences) per call, and what each
    processes per problem."""
    cases: dict[str, Any] = {}
    work: dict[str, dict] = {}
    students: dict[Path, tuple[Any, Any]] = {}
    frozen: dict[str, Any] = {}
    for p in points:
        name = f"{p['model']}/{p['sampler']}/nfe{p['nfe']}/b{batch}"
        if p["model"] in ("ar", "teacher"):
            model, tokenizer = load_lm(p["lm_dir"])
            prompts = [lm_prompt(q) for q in problems]
            cases[name] = (lambda m=model, t=tokenizer, ps=prompts, n=study.base.text.canvas_len:
                           greedy_generate(m, t, ps, max_new_tokens=n, batch_size=batch))
            texts = cases[name]()
            prompt_tokens = [len(tokenizer(q, add_special_tokens=False)["input_ids"]) for q in prompts]
            new_tokens = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts]
            work[name] = {"positions": statistics.fmean(a + b for a, b in zip(prompt_tokens, new_tokens, strict=True)),
                          "calls": statistics.fmean(new_tokens)}
            continue
        if p["checkpoint"] not in students:
            ckpt = open_checkpoint(p["checkpoint"])
            students[p["checkpoint"]] = ckpt.load_student(use_ema=True), ckpt.config
        student, cfg = students[p["checkpoint"]]
        text_key = repr(cfg.text)  # a distilled student reads its teacher's frozen models
        if text_key not in frozen:
            frozen[text_key] = load_frozen_text(cfg.text, with_teacher=False)
        prompts = [as_example(q).prompt for q in problems]
        cases[name] = (lambda s=student, f=frozen[text_key], ps=prompts, sc=p["sample"], c=cfg:
                       generate(s, ps, sc, frozen_text=f, flow=c.flow, batch_size=batch, progress=False))
        calls = statistics.fmean(r.nfe for r in cases[name]())
        work[name] = {"positions": calls * cfg.text.canvas_len, "calls": calls}
    return cases, work


def measure(study: Study, points: list[dict], problems: list[dict], batches: list[int], repeats: int
            ) -> list[dict[str, Any]]:
    """Seconds per problem of every point at every batch size, all cases of one batch size timed
    interleaved (an untimed first round warms every case up)."""
    rows = []
    for batch in batches:
        cases, work = timing_cases(study, points, problems, batch)
        seconds = interleaved(cases, repeats, torch.device("cpu"), warmup=0)
        for p in points:
            name = f"{p['model']}/{p['sampler']}/nfe{p['nfe']}/b{batch}"
            rows.append({**{k: v for k, v in p.items() if k not in TIMING_ONLY}, "batch": batch,
                         "seconds_per_problem": seconds[name] / len(problems), **work[name]})
    return rows


SUMMARISED = ("elf-reg", "elf-reg-distilled")


def summarise(rows: list[dict], batches: list[int]) -> dict[str, Any]:
    """Per model of :data:`SUMMARISED` measured, per batch size: its best pass@1, its fastest setting
    within :data:`WITHIN` of it, and that setting against the AR baseline (speed ratio > 1: the
    flow model is faster)."""
    return {m: by_batch for m in SUMMARISED if (by_batch := _summarise_model(rows, batches, m))}


def _summarise_model(rows: list[dict], batches: list[int], model: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in batches:
        mine = [r for r in rows if r["batch"] == b and r["model"] == model]
        ar = next((r for r in rows if r["batch"] == b and r["model"] == "ar"), None)
        if not mine or ar is None:
            continue
        best = max(r["pass@1"] for r in mine)
        fastest = min((r for r in mine if r["pass@1"] >= best - WITHIN), key=lambda r: r["seconds_per_problem"])
        out[str(b)] = {"best_pass@1": best, "fastest_within": fastest, "ar": ar,
                       "speed_over_ar": ar["seconds_per_problem"] / fastest["seconds_per_problem"],
                       "accuracy_over_ar": fastest["pass@1"] - ar["pass@1"],
                       "positions_over_ar": fastest["positions"] / ar["positions"]}
    return out


def plot(rows: list[dict], batch: int, path: Path) -> Path:
    from elfreg.toy.report import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for (model, sampler) in dict.fromkeys((r["model"], r["sampler"]) for r in rows if r["batch"] == batch):
        pts = sorted((r for r in rows if (r["batch"], r["model"], r["sampler"]) == (batch, model, sampler)),
                     key=lambda r: r["seconds_per_problem"])
        xs, ys = [r["seconds_per_problem"] for r in pts], [100 * r["pass@1"] for r in pts]
        if model in ("ar", "teacher"):
            ax.scatter(xs, ys, marker="*", s=160, zorder=3, label=f"{model} (greedy, KV cache)")
        else:
            ax.plot(xs, ys, marker="o", ms=4, lw=1, label=f"{model} {sampler}")
            for r in pts:
                ax.annotate(str(r["nfe"]), (r["seconds_per_problem"], 100 * r["pass@1"]), fontsize=6,
                            xytext=(2, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel(f"seconds per problem at batch {batch} (log; labels: NFE)")
    ax.set_ylabel("pass@1 (%) on the held-out chains")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def markdown(rows: list[dict], summary: dict, batches: list[int]) -> str:
    lines = []
    for b in batches:
        lines += [f"### Batch {b}", "", "| model | sampler | NFE | pass@1 (%) | s / problem | calls | positions |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in sorted((r for r in rows if r["batch"] == b), key=lambda r: r["seconds_per_problem"]):
            lines.append(f"| {r['model']} | {r['sampler']} | {r['nfe'] if r['nfe'] else '–'} | "
                         f"{100 * r['pass@1']:.1f} | {r['seconds_per_problem']:.4f} | {r['calls']:.1f} | "
                         f"{r['positions']:.0f} |")
        for model, by_batch in summary.items():
            if str(b) not in by_batch:
                continue
            s = by_batch[str(b)]
            f = s["fastest_within"]
            lines += ["", f"{model}'s best {100 * s['best_pass@1']:.1f} %; fastest within one point: {f['sampler']} "
                      f"at {f['nfe']} NFE, {100 * f['pass@1']:.1f} %, {f['seconds_per_problem']:.4f} s; AR "
                      f"{100 * s['ar']['pass@1']:.1f} %, {s['ar']['seconds_per_problem']:.4f} s: "
                      f"{s['speed_over_ar']:.2f}x AR's speed, {100 * s['accuracy_over_ar']:+.1f} points, "
                      f"{s['positions_over_ar']:.1f}x the positions processed"]
        lines.append("")
    return "\n".join(lines)


def quick_inputs(root: Path) -> tuple[Study, Path, Path]:
    """A study of one tiny ELF-REG model, distilled into 2- and 1-step students, and its AR
    baseline (the CI-sized toy LMs, a few steps), trained into ``root``: the machinery end to
    end, at no accuracy."""
    base = demo_config(quick=True, overrides=["data.toy_level=2", "data.toy_balance=combination",
                                              "text.canvas_len=104", "text.prompt_cap=48", "eval.limit=4",
                                              "eval.curve_points=0"]).to_dict()
    for key in ("out_dir", "progress", "seed"):
        base["train"].pop(key, None)
    base["train"].update(steps=4, batch_size=4, ckpt_every=4)
    base.pop("eval", None)
    base["eval"] = {"split": "test", "limit": 4, "curve_points": 0}
    distill = {"distill": {"student_steps": [2, 1], "teacher_steps": [2, 2], "round_sampling": "sample"},
               "sample": {"sampler": "full-span", "full_span_grid": "uniform"},
               "train": {"steps": 2, "batch_size": 4, "ckpt_every": 2, "warmup_steps": 1, "out_dir": "unused"}}
    plan = {"base": base, "models": ["elf-reg"], "train_seeds": [0], "samplers": ["early-stop", "full-span"],
            "nfes": [2, 4], "sample_seeds": [0],
            "distill": {"config": distill, "models": ["elf-reg"], "samplers": ["round", "early-stop"]}}
    root.mkdir(parents=True, exist_ok=True)
    (root / "plan.json").write_text(json.dumps(plan))
    study = load_plan(root / "plan.json")
    run_study(study, root / "study", progress=False)
    run_ar_baseline(study.run_config(study.train_cells()[0], root / "unused", progress=False), root / "ar", [0],
                    progress=False)
    return study, root / "study", root / "ar"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", help="the study's plan (e.g. configs/study-toy-level2.yaml)")
    p.add_argument("--study", help="the study's folder")
    p.add_argument("--ar", help="the AR baseline's folder (elfreg ar-baseline --out)")
    p.add_argument("--quick", action="store_true", help="train tiny inputs into OUT/quick-inputs and measure them")
    p.add_argument("--models", nargs="*", help="only these models of the study (default: all)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--timing-problems", type=int, default=32, help="held-out problems each case is timed on")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    if args.quick:
        study, study_dir, ar_dir = quick_inputs(out / "quick-inputs")
        args.batches, args.timing_problems, args.repeats = [1, 2], 2, 1
    else:
        if not (args.plan and args.study and args.ar):
            p.error("give --plan, --study and --ar (or --quick)")
        study, study_dir, ar_dir = load_plan(args.plan), Path(args.study), Path(args.ar)
    problems = heldout_problems(study.base)
    points = [pt for pt in study_points(study, study_dir) if not args.models or pt["model"] in args.models]
    points += [ar_point(ar_dir), teacher_point(study, problems)]
    rows = measure(study, points, problems[: args.timing_problems], args.batches, args.repeats)
    summary = summarise(rows, args.batches)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"plan": study.to_dict(), "study": str(study_dir), "ar": str(ar_dir), "batches": args.batches,
                "timing_problems": args.timing_problems, "repeats": args.repeats, "n_problems": len(problems)}
    write_report(out / "frontier.json", settings, rows, summary=summary)
    (out / "frontier.md").write_text(markdown(rows, summary, args.batches))
    figures = [plot(rows, b, out / f"frontier-batch{b}.png") for b in args.batches]
    print(markdown(rows, summary, args.batches))
    print(f"wrote {out / 'frontier.json'}, {out / 'frontier.md'}, {', '.join(str(f) for f in figures)}")
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":
    main()
