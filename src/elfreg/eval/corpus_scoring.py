"""Scoring a corpus task (:class:`~elfreg.eval.tasks.elf.CorpusTask`: ELF's XSum, WMT14 De-En and
Gen-PPL): the path :func:`elfreg.eval.scoring.score_predictions` takes for them.

Contract of :func:`score_corpus`: sample ``j`` of every problem (its ``j``-th prediction,
generation seed ``seed + j``) makes corpus ``j``, scored whole by the task; the summary holds
each corpus's metrics (``per_seed``), their mean (``metrics``) and their sample standard
deviation across seeds (``metrics_std``, 0 with one seed), beside the coverage fields every
summary has. ``samples.jsonl`` holds one record per sample with its reference and any per-sample
metric (ROUGE of the pair). A corpus needs every selected problem's ``j``-th sample: a seed some
problem lacks is left out and counted (``n_not_scored``), so the summary says it is partial.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .predictions import Prediction
from .reporting import EvalReport, write_outputs
from .tasks.elf import CorpusTask

__all__ = ["format_corpus_table", "score_corpus"]


def score_corpus(task: CorpusTask, selected: Sequence[str], by_id: Mapping[str, Sequence[Prediction]], *,
                 ignored: int, config: Mapping[str, Any], started: float, out_dir: Any = None,
                 should_stop: Callable[[], bool] | None = None) -> EvalReport:
    """The report of a corpus task's predictions, grouped by task id (``by_id``, sample order)."""
    scored_ids = [tid for tid in selected if by_id.get(tid)]
    problems = [task.problem(tid) for tid in scored_ids]
    seeds = max((len(by_id[tid]) for tid in scored_ids), default=0)
    complete_seeds = [j for j in range(seeds) if all(len(by_id[tid]) > j for tid in scored_ids)]
    per_seed: dict[str, dict[str, Any]] = {}
    for j in complete_seeds:
        if should_stop is not None and should_stop():
            break
        per_seed[str(j)] = task.corpus_scores(problems, [by_id[tid][j].text for tid in scored_ids])
    records = []
    for tid, problem in zip(scored_ids, problems, strict=True):
        for j, p in enumerate(by_id[tid]):
            record = {"task_id": tid, "sample": j, "form": p.form, "output": p.text,
                      "reference": problem.get("reference")}
            scores = task.sample_scores(problem, p.text) if problem.get("reference") is not None else {}
            if scores:
                record["scores"] = scores
            if p.extra:
                record["meta"] = dict(p.extra)
            records.append(record)
    numeric = [k for k in task.metric_names if all(isinstance(s.get(k), int | float) for s in per_seed.values())]
    n_samples = sum(len(by_id[tid]) for tid in scored_ids)
    left_out = n_samples - len(per_seed) * len(scored_ids)
    summary: dict[str, Any] = {
        "task": task.name,
        "complete": left_out == 0 and bool(per_seed),
        "n_not_scored": left_out,
        "n_problems": len(scored_ids),
        "n_problems_total": len(selected),
        "coverage": len(scored_ids) / len(selected) if selected else 0.0,
        "n_missing": len(selected) - len(scored_ids),
        "missing_task_ids": [tid for tid in selected if not by_id.get(tid)][:50],
        "n_samples": n_samples,
        "n_seeds": len(per_seed),
        "metrics": {k: statistics.fmean(s[k] for s in per_seed.values()) for k in numeric} if per_seed else {},
        "metrics_std": {k: statistics.stdev(s[k] for s in per_seed.values()) if len(per_seed) > 1 else 0.0
                        for k in numeric},
        "per_seed": per_seed,
        "headline_score": task.headline,
        "predictions_ignored_by_limit": ignored,
        "config": {**task.describe(), **dict(config)},
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    table = format_corpus_table(summary)
    if out_dir is not None:
        write_outputs(out_dir, summary, records, table)
    return EvalReport(summary, records, table)


def format_corpus_table(summary: Mapping[str, Any]) -> str:
    """A plain-text table of a corpus task's summary: each metric's mean ± std over seeds."""
    head = (f"task {summary['task']}: {summary['n_problems']}/{summary['n_problems_total']} problems "
            f"(coverage {100 * summary['coverage']:.1f}%), {summary['n_samples']} samples, "
            f"{summary['n_seeds']} corpus/corpora (one per seed)")
    if not summary["complete"]:
        head += f"; PARTIAL: {summary['n_not_scored']} samples not scored (a seed some problem lacks, or stopped)"
    lines = [head, "", f"{'metric':<12}{'mean':>10}{'±std':>10}"]
    for name, value in summary["metrics"].items():
        lines.append(f"{name:<12}{value:>10.3f}{summary['metrics_std'][name]:>10.3f}")
    signature = next((s.get("bleu_signature") for s in summary["per_seed"].values() if "bleu_signature" in s), None)
    if signature:
        lines += ["", f"BLEU: sacreBLEU {signature}; bleu_elf: lowercased, effective order (ELF's)"]
    return "\n".join(lines) + "\n"
