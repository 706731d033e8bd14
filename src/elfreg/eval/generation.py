"""Generation from a checkpoint, then scoring: the path of ``elfreg eval --checkpoint``.

Contract of :func:`evaluate_checkpoint`: the task's zero-shot prompts go to the sampling room
in one call (:func:`_sampling_call`, the eval room's only use of it); sample ``j`` of every
prompt is generated with seed ``seed + j``; the outputs are saved as ``predictions.jsonl``
(``solution`` records with their seed, re-scorable with ``--predictions``) and scored by
:func:`elfreg.eval.scoring.score_predictions`, with the generation settings recorded in the
summary's ``config``. A missing sampling API is an :class:`EvalError` raised before the task's
data is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .reporting import EvalReport, write_jsonl
from .scoring import score_predictions
from .tasks import Task, get_task

__all__ = ["EvalError", "evaluate_checkpoint"]

#: ``(checkpoint, prompts, samples, nfe, sampler, seed, options) → outputs[prompt][sample]``
Generate = Callable[[str, list[str], int, int, str, int, Mapping[str, Any]], list[list[str]]]


class EvalError(RuntimeError):
    """The evaluation could not run (e.g. the sampling API is missing)."""


def _sampling_call() -> Generate:
    """The call into the sampling room; importing it first makes a missing API fail early."""
    try:
        from elfreg.sampling.api import generate_from_checkpoint
    except ImportError as err:
        raise EvalError(
            "generation needs elfreg.sampling.api.generate_from_checkpoint, which is not available "
            f"({err}); score existing outputs with --predictions instead"
        ) from err

    def generate(checkpoint: str, prompts: list[str], samples: int, nfe: int, sampler: str, seed: int,
                 options: Mapping[str, Any]) -> list[list[str]]:
        return generate_from_checkpoint(checkpoint, prompts, samples=samples, nfe=nfe, sampler=sampler, seed=seed,
                                        **dict(options))

    return generate


def evaluate_checkpoint(
    task: str | Task,
    checkpoint: str,
    *,
    samples: int = 16,
    nfe: int = 64,
    sampler: str = "early-stop",
    seed: int = 0,
    limit: int | None = None,
    out_dir: str | os.PathLike | None = None,
    generate_kwargs: Mapping[str, Any] | None = None,
    task_options: Mapping[str, Any] | None = None,
    **score_kwargs: Any,
) -> EvalReport:
    """Generate ``samples`` outputs per prompt from a checkpoint, then score them.

    Sample ``j`` of every prompt is generated with seed ``seed + j``. The outputs are written to
    ``out_dir/predictions.jsonl`` (``solution`` records), so they can be re-scored later.
    Remaining keyword arguments go to :func:`score_predictions`.

    Raises:
        EvalError: the sampling API is missing, or returned the wrong number of outputs.
    """
    generate = _sampling_call()
    task_obj = task if isinstance(task, Task) else get_task(task, **dict(task_options or {}))
    problems = task_obj.problems()[:limit] if limit is not None else task_obj.problems()
    prompts = [task_obj.prompt(p) for p in problems]
    outputs = generate(checkpoint, prompts, samples, nfe, sampler, seed, generate_kwargs or {})
    if len(outputs) != len(prompts) or any(len(o) != samples for o in outputs):
        raise EvalError(
            f"generate_from_checkpoint returned {len(outputs)} lists for {len(prompts)} prompts "
            f"(expected {samples} outputs each)"
        )
    records = [
        {"task_id": p["task_id"], "solution": str(text), "seed": seed + j}
        for p, outs in zip(problems, outputs, strict=True)
        for j, text in enumerate(outs)
    ]
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_jsonl(Path(out_dir) / "predictions.jsonl", records)
    config = {"checkpoint": checkpoint, "samples": samples, "nfe": nfe, "sampler": sampler, "seed": seed,
              "generate_kwargs": dict(generate_kwargs or {})}
    config.update(score_kwargs.pop("config", None) or {})
    return score_predictions(task_obj, records, limit=limit, out_dir=out_dir, config=config, **score_kwargs)
