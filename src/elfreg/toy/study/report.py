"""The study's results table: for each (model, sampler, NFE), pass@1 and its two spreads.

For one (model, sampler, NFE) let ``p[t][s]`` be pass@1 over the held-out problems of the model
trained with seed ``t``, sampled with seed ``s``. Then

* ``pass@1`` is the mean over training seeds of the per-training-seed means ``m[t] = mean_s p[t][s]``
  (the mean over every row when the grid is complete);
* ``train_seed_std`` is the sample std (n − 1) of the ``m[t]``: how much the result moves when
  the model is trained again;
* ``sample_seed_std`` is the mean over training seeds of the sample std (n − 1) of ``p[t][s]``
  over ``s``: how much it moves when the same model samples again (the demo's "±").

A spread over fewer than two seeds is unknown and reported as ``None`` ("n/a" in the table). Beside
them, the mean token match (:func:`elfreg.toy.demo.token_match`), which moves long before whole
answers come out right. A plan that distils adds a second table, by the same rule: for each
(model, round's N, sampler), the distilled student and the model it was distilled from, both at
N + 1 NFE.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from elfreg.jsonl import read_jsonl
from elfreg.toy.report import LEVEL_NAMES, _pyplot
from elfreg.toy.study.plan import Study


def spreads(by_train_seed: dict[int, list[float]]) -> dict:
    """pass@1 and the two spreads from ``{training seed: [pass@1 of each sampling seed]}``."""
    groups = [v for v in by_train_seed.values() if v]
    if not groups:
        return {"pass@1": None, "train_seed_std": None, "sample_seed_std": None, "n_train_seeds": 0,
                "n_sample_seeds": 0}
    means = [statistics.fmean(v) for v in groups]
    within = [statistics.stdev(v) if len(v) > 1 else None for v in groups]
    return {"pass@1": statistics.fmean(means),
            "train_seed_std": statistics.stdev(means) if len(means) > 1 else None,
            "sample_seed_std": None if None in within else statistics.fmean(within),
            "n_train_seeds": len(groups), "n_sample_seeds": min(len(v) for v in groups)}


def _entry(cells: list, rows: dict[str, dict]) -> dict:
    """pass@1, its spreads and the token match of ``cells`` from their rows; ``complete`` says
    whether every cell has its row."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    found = [rows[c.id] for c in cells if c.id in rows]
    for cell in cells:
        if cell.id in rows:
            by_seed[cell.train_seed].append(rows[cell.id]["pass@1"])
    matches = [r["token_match"] for r in found if "token_match" in r]
    return {**spreads(by_seed), "token_match": statistics.fmean(matches) if matches else None,
            "cells": len(found), "complete": len(found) == len(cells)}


def table_entries(study: Study, rows: dict[str, dict]) -> list[dict]:
    """One entry per (model, sampler, NFE) of the plan, in plan order, from the rows by cell id;
    ``complete`` says whether every cell of the entry has its row."""
    return [{"model": model, "sampler": sampler, "nfe": nfe,
             **_entry([c for c in study.eval_cells() if (c.model, c.sampler, c.nfe) == (model, sampler, nfe)], rows)}
            for model in study.plan.models for sampler in study.plan.samplers if study.applies(model, sampler)
            for nfe in study.plan.nfes]


def distilled_entries(study: Study, rows: dict[str, dict]) -> list[dict]:
    """One entry per (model, round's N, sampler, teacher or distilled student) of the plan's
    distillation, in plan order, from the distilled rows by cell id (none without one)."""
    if study.distill is None:
        return []
    cells = study.distilled_cells()
    return [{"model": model, "student": "distilled" if distilled else "teacher", "steps": n, "sampler": sampler,
             "nfe": n + 1, **_entry([c for c in cells if (c.model, c.steps, c.sampler, c.distilled)
                                     == (model, n, sampler, distilled)], rows)}
            for model in study.plan.distill.models for n in study.distill_steps for sampler in study.distill_samplers
            for distilled in (False, True)]


def build_report(study: Study, rows: dict[str, dict], run_dirs: dict[str, Path],
                 distilled_rows: dict[str, dict] | None = None) -> dict:
    """Everything ``results.json`` holds: the plan, the table, the training cells and the rows;
    with a distillation, its table (``distilled``) and rows (``distilled_rows``) too."""
    training = {}
    for cell_id, folder in run_dirs.items():
        curve = read_jsonl(Path(folder) / "accuracy_curve.jsonl", missing_ok=True)
        training[cell_id] = {"run_dir": str(folder), "steps": curve[-1]["step"] if curve else None,
                             "train_seconds": round(curve[-1]["train_seconds"], 1) if curve else None}
    ordered = [rows[c.id] for c in study.eval_cells() if c.id in rows]
    table = table_entries(study, rows)
    report = {"identity": study.identity(), "plan": study.to_dict(),
              "problems": {"split": study.base.eval.split, "level": study.base.data.toy_level,
                           "limit": study.base.eval.limit, "n": ordered[0]["n_problems"] if ordered else None},
              "complete": all(e["complete"] for e in table), "table": table, "training": training, "rows": ordered}
    if study.distill is not None:
        drows = distilled_rows or {}
        report["distilled"] = distilled_entries(study, drows)
        report["distilled_rows"] = [drows[c.id] for c in study.distilled_cells() if c.id in drows]
        report["complete"] = report["complete"] and all(e["complete"] for e in report["distilled"])
    return report


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def format_table(report: dict) -> str:
    """The table as Markdown, with a header saying what each number is."""
    p = report["problems"]
    lines = [f"pass@1 (%) on {p['n']} held-out {LEVEL_NAMES.get(p['level'], p['level'])} problems "
             f"({p['split']} split). ± train: std (n − 1) over training seeds of the per-seed means; "
             "± sample: mean over training seeds of the std (n − 1) over sampling seeds; token match: share of "
             "the gold answer's tokens in place (%), mean over the cells.", "",
             "| model | sampler | NFE | pass@1 | ± train | ± sample | token match | seeds (train × sample) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in report["table"]:
        seeds = f"{e['n_train_seeds']} × {e['n_sample_seeds']}" + ("" if e["complete"] else " (incomplete)")
        numbers = " | ".join(_pct(e[k]) for k in ("pass@1", "train_seed_std", "sample_seed_std", "token_match"))
        lines.append(f"| {e['model']} | {e['sampler']} | {e['nfe']} | {numbers} | {seeds} |")
    text = "\n".join(lines) + "\n\n" + format_pivot(report)
    return text + ("\n\n" + format_distilled(report) if "distilled" in report else "")


def _with_spread(e: dict) -> str:
    mark = "" if e["complete"] else "*"
    return f"{_pct(e['pass@1'])} (± {_pct(e['train_seed_std'])}){mark}"


def format_distilled(report: dict) -> str:
    """The distillation's table: each round's student beside its teacher at the same NFE and
    sampler (``round``: the round's own setting), and the difference of their pass@1."""
    lines = ["Distilled students beside the models they were distilled from, at the same NFE (N steps + the "
             "decode) and sampler; pass@1 (%) mean (± train); round: the sampling each round was distilled for; "
             "* marks an entry with cells still missing.", "",
             "| model | N | NFE | sampler | teacher | distilled | distilled − teacher | seeds (train × sample) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    pairs: dict[tuple, dict[str, dict]] = {}
    for e in report["distilled"]:
        pairs.setdefault((e["model"], e["steps"], e["sampler"]), {})[e["student"]] = e
    for (model, n, sampler), pair in pairs.items():
        teacher, student = pair["teacher"], pair["distilled"]
        gap = (None if teacher["pass@1"] is None or student["pass@1"] is None
               else f"{100 * (student['pass@1'] - teacher['pass@1']):+.1f}")
        seeds = f"{student['n_train_seeds']} × {student['n_sample_seeds']}"
        lines.append(f"| {model} | {n} | {n + 1} | {sampler} | {_with_spread(teacher)} | {_with_spread(student)} | "
                     f"{gap or 'n/a'} | {seeds} |")
    return "\n".join(lines)


def format_pivot(report: dict) -> str:
    """The same pass@1 with NFE across: one row per (model, sampler), each cell
    ``pass@1 (± train, ± sample)``; ``*`` marks a cell whose grid is incomplete."""
    nfes = sorted({e["nfe"] for e in report["table"]})
    rows: dict[tuple[str, str], dict[int, dict]] = {}
    for e in report["table"]:
        rows.setdefault((e["model"], e["sampler"]), {})[e["nfe"]] = e
    lines = ["pass@1 (%) by NFE: mean (± train, ± sample); * marks a cell with cells still missing.", "",
             "| model | sampler | " + " | ".join(f"NFE {n}" for n in nfes) + " |",
             "| --- | --- | " + " | ".join("---" for _ in nfes) + " |"]
    for (model, sampler), by_nfe in rows.items():
        cells = []
        for n in nfes:
            e = by_nfe.get(n)
            if e is None or e["pass@1"] is None:
                cells.append("–")
                continue
            mark = "" if e["complete"] else "*"
            cells.append(f"{_pct(e['pass@1'])} ({_pct(e['train_seed_std'])}, {_pct(e['sample_seed_std'])}){mark}")
        lines.append(f"| {model} | {sampler} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_pass1_vs_nfe(report: dict, path: Path) -> tuple[float, float]:
    """pass@1 against NFE, one panel per model, one line per sampler; error bars are the spread
    over training seeds. Returns the y range (%) that every panel shares."""
    plt = _pyplot()
    models = list(dict.fromkeys(e["model"] for e in report["table"]))
    cols = min(len(models), 3)
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), sharey=True, squeeze=False)
    samplers = list(dict.fromkeys(e["sampler"] for e in report["table"]))
    for ax, model in zip(axes.flat, models, strict=False):
        for sampler in samplers:
            line = [e for e in report["table"] if (e["model"], e["sampler"]) == (model, sampler)
                    and e["pass@1"] is not None]
            if not line:
                continue
            k = samplers.index(sampler)
            ax.errorbar([e["nfe"] for e in line], [100 * e["pass@1"] for e in line],
                        yerr=[100 * (e["train_seed_std"] or 0.0) for e in line], fmt=("-o", "--s", ":^", "-.d")[k % 4],
                        color=f"C{k}", capsize=3, label=sampler)
        nfes = sorted({e["nfe"] for e in report["table"]})
        ax.set_xscale("log", base=2)
        ax.set_xticks(nfes, [str(n) for n in nfes])
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("NFE")
        if ax.get_lines():  # a model with no finished cell yet (a partial report) has none
            ax.legend(fontsize=7)
    # the panels share one y axis: set it once from every entry (a limit set panel by panel would
    # freeze autoscaling at the first panel's data and clip the others); 10 % keeps an all-zero
    # study readable as percent
    tops = [100 * (e["pass@1"] + (e["train_seed_std"] or 0.0)) for e in report["table"] if e["pass@1"] is not None]
    y_range = axes[0, 0].set_ylim(0, max([10.0, *tops]) * 1.05)
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("pass@1 (%), ± training-seed std")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return y_range


def write_outputs(out: Path, report: dict) -> list[Path]:
    """Write ``results.json``, ``table.md`` and ``pass1_vs_nfe.png``; return their paths."""
    paths = [out / "results.json", out / "table.md", out / "pass1_vs_nfe.png"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(format_table(report) + "\n")
    plot_pass1_vs_nfe(report, paths[2])
    return paths
