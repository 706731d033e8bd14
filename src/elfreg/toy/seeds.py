"""``elfreg demo --seeds S ...``: one recipe trained with several training seeds, and how far its
runs lie apart.

A toy result is only worth quoting when the recipe's training runs agree: with one seed a
newcomer's number is a draw. Each seed is an ordinary demo run (resumable, locked) into
``<out>/seed-<S>``, whose finished report is reused when the same command (or one with more
seeds) runs again (:func:`finished_report`); this module then writes beside them

    seeds.json           every run's pass@1 per (model, sampler, NFE), and their mean, sample std,
                         minimum, maximum and span (max - min), with the config
    seeds.txt            the same as a table
    seed_curves.png      the runs' learning curves together: training losses against step, and
                         held-out pass@1 against step where ``eval.curve_points`` asked for it
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from elfreg.config import Config
from elfreg.runs import locked
from elfreg.toy.report import plot_seed_curves

CURVE_LOSSES = ("denoise", "decode")
"""Loss terms of ``metrics.jsonl`` drawn in the seeds' figure (flow matching and token decoding)."""


def parse_seeds(text: str) -> list[int]:
    """Training seeds from ``"1-5"``, ``"0,2,7"`` or a mix (``"1-3,9"``), in the order given; a
    seed given twice, a reversed range or a non-number is refused."""
    seeds: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"--seeds: {part.strip()!r} is not a seed or a range such as 1-5")
        if dash and int(high) < int(low):
            raise ValueError(f"--seeds: the range {part.strip()!r} runs backwards")
        seeds += range(int(low), int(high) + 1) if dash else [int(low)]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: a training seed is given twice in {text!r}")
    return seeds


def seed_config(cfg: Config, seed: int) -> Config:
    """``cfg`` with training seed ``seed``; nothing else changes."""
    data = cfg.to_dict()
    data["train"]["seed"] = seed
    return Config.from_dict(data)


def spread(reports: dict[int, dict]) -> list[dict]:
    """One row per (model, sampler, NFE) of the runs' reports (keyed by training seed): each run's
    pass@1 (its mean over sampling seeds) and, over the runs, mean, sample std (0 for one run),
    min, max and span. Every report must hold the same cells: runs of one recipe measured alike."""
    scores = {seed: {(v, r["sampler"], r["nfe"]): r["mean"] for v, m in report["models"].items()
                     for r in m["results"]} for seed, report in reports.items()}
    cells = list(next(iter(scores.values()), {}))
    for seed, cell_scores in scores.items():
        if list(cell_scores) != cells:
            raise ValueError(f"training seed {seed} was measured on other cells than the first run: "
                             f"{sorted(set(cell_scores) ^ set(cells))}")
    rows = []
    for variant, sampler, nfe in cells:
        per_seed = {seed: cell_scores[(variant, sampler, nfe)] for seed, cell_scores in scores.items()}
        values = list(per_seed.values())
        rows.append({"model": variant, "sampler": sampler, "nfe": nfe, "per_seed": per_seed,
                     "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                     "min": min(values), "max": max(values), "span": max(values) - min(values)})
    return rows


def format_spread(rows: list[dict]) -> str:
    """The rows of :func:`spread` as a text table in percent."""
    seeds = list(rows[0]["per_seed"]) if rows else []
    head = f"{'model':<8} {'sampler':<11} {'NFE':>4} " + " ".join(f"{'seed ' + str(s):>8}" for s in seeds)
    lines = [head + f" {'mean':>6} {'sd':>5} {'span':>5}"]
    for r in rows:
        lines.append(f"{r['model']:<8} {r['sampler']:<11} {r['nfe']:>4} "
                     + " ".join(f"{100 * r['per_seed'][s]:8.1f}" for s in seeds)
                     + f" {100 * r['mean']:6.1f} {100 * r['std']:5.1f} {100 * r['span']:5.1f}")
    return "\n".join(lines)


def seed_curves(reports: dict[int, dict], variant: str) -> dict[int, dict]:
    """Per training seed, the ``variant``'s loss curves (:data:`CURVE_LOSSES` against step, from
    its ``metrics.jsonl`` rows) and its held-out accuracy curve (empty without curve points)."""
    out = {}
    for seed, report in reports.items():
        model = report["models"][variant]
        rows = [m for m in model["learning_curve"] if all(k in m for k in CURVE_LOSSES)]
        out[seed] = {"step": [m["step"] for m in rows], **{k: [m[k] for m in rows] for k in CURVE_LOSSES},
                     "accuracy": [(p["step"], p["pass@1"]) for p in model["accuracy_curve"]]}
    return out


def run_seeds(cfg: Config, out_dir: str | Path, seeds: list[int], compare: bool = False,
              progress: bool = True) -> dict:
    """Run the demo once per training seed into ``out_dir/seed-<S>`` (each resumable), then write
    ``seeds.json``, ``seeds.txt`` and ``seed_curves.png`` into ``out_dir``; return the summary."""
    from elfreg.toy.demo import run_demo  # the demo's command imports this module

    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"run_seeds needs distinct training seeds, got {seeds}")
    with locked(out_dir, what="seeds folder") as out:
        reports = {}
        for s in seeds:
            run_cfg, folder = seed_config(cfg, s), out / f"seed-{s}"
            reports[s] = (finished_report(run_cfg, folder, compare)
                          or run_demo(run_cfg, folder, compare=compare, progress=progress))
        return _write_summary(cfg, out, reports)


def finished_report(cfg: Config, folder: Path, compare: bool) -> dict | None:
    """The report (``results.json``) a finished demo run left in ``folder``, when it measured what
    ``cfg`` and ``compare`` ask for now: the same models, the same course and length of training
    (:func:`~elfreg.train.build.course_changes`, ``train.steps``), the same evaluation and sampler
    settings, and each model's newest checkpoint still the one it reports. Else None: the run is
    finished or measured again (a seed added to a set of seeds evaluates only the new one)."""
    from elfreg.checkpoint import resolve_checkpoint
    from elfreg.train.build import course_changes

    try:
        report = json.loads((folder / "results.json").read_text())
        saved = Config.from_dict(report["config"])
    except (OSError, ValueError, KeyError):  # none, cut by a kill, or not a report
        return None
    if (report.get("compare") != compare or course_changes(cfg, saved)
            or (saved.train.steps, saved.eval, saved.sample) != (cfg.train.steps, cfg.eval, cfg.sample)):
        return None
    for variant, model in report["models"].items():
        newest = resolve_checkpoint(folder / variant)
        if newest is None or newest.name != Path(model["checkpoint"]).name:
            return None
    return report


def _write_summary(cfg: Config, out: Path, reports: dict[int, dict]) -> dict:
    seeds = list(reports)
    rows = spread(reports)
    summary = {"config": cfg.to_dict(), "seeds": seeds, "rows": rows,
               "total_seconds": {s: r["total_seconds"] for s, r in reports.items()},
               "runs": {s: str(out / f"seed-{s}") for s in seeds}}
    paths = [out / "seeds.json", out / "seeds.txt", out / "seed_curves.png"]
    paths[0].write_text(json.dumps(summary, indent=2))
    paths[1].write_text(format_spread(rows) + "\n")
    plot_seed_curves({v: seed_curves(reports, v) for v in reports[seeds[0]]["models"]}, paths[2])
    summary["outputs"] = [str(p) for p in paths]
    return summary
