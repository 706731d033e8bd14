"""Generation from a checkpoint, then scoring: the path of ``elfreg eval --checkpoint``.

Contract of :func:`evaluate_checkpoint`: the task's zero-shot prompts (in the template the
checkpoint was trained with, ``data.template``, unless one is given) go to the sampling room
in one call (:func:`_generate`, the eval room's only use of it); the sampler settings are the
checkpoint's ``sample`` section with ``sample_overrides`` applied; sample ``j`` of every prompt
is generated with seed ``seed + j``; the outputs are saved as ``predictions.jsonl`` (``solution``
records with their seed, re-scorable with ``--predictions``) and scored by
:func:`elfreg.eval.scoring.score_predictions`, with the resolved sampler settings recorded in the
summary's ``config``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .reporting import EvalReport, write_jsonl
from .scoring import score_predictions
from .tasks import Task, get_task

__all__ = ["EvalError", "evaluate_checkpoint"]


class EvalError(RuntimeError):
    """The evaluation could not run (e.g. the generator returned the wrong number of outputs)."""


def _generate(checkpoint: str, prompts: list[str], sample_overrides: Mapping[str, Any], samples: int, seed: int,
              batch_size: int, device: str, precision: str, progress: bool) -> tuple[list[list[str]], dict[str, Any]]:
    """``outputs[prompt][sample]`` texts and the resolved sampler settings."""
    from elfreg.sampling import generate, load_checkpoint

    models = load_checkpoint(checkpoint, device, precision)
    sample = models.config.sample.replace(**dict(sample_overrides))
    outputs: list[list[str]] = [[] for _ in prompts]
    for r in generate(models, prompts, sample, samples=samples, seed=seed, batch_size=batch_size, progress=progress):
        outputs[r.prompt_index].append(r.text)
    return outputs, dataclasses.asdict(sample)


def _trained_template(checkpoint: str) -> str | None:
    """The ``data.template`` a checkpoint was trained with (``None`` when it cannot be read: the
    generation step then names the problem)."""
    from elfreg.checkpoint import open_checkpoint

    try:
        return open_checkpoint(checkpoint).config.data.template
    except (OSError, ValueError, RuntimeError):
        return None


def evaluate_checkpoint(
    task: str | Task,
    checkpoint: str,
    *,
    sample_overrides: Mapping[str, Any] | None = None,
    samples: int = 16,
    seed: int = 0,
    limit: int | None = None,
    batch_size: int = 8,
    device: str = "auto",
    precision: str = "auto",
    out_dir: str | os.PathLike | None = None,
    task_options: Mapping[str, Any] | None = None,
    **score_kwargs: Any,
) -> EvalReport:
    """Generate ``samples`` outputs per prompt from a checkpoint, then score them.

    ``sample_overrides`` are ``SampleConfig`` fields (``nfe``, ``sampler``, ``sc_cfg``, …) that
    replace the checkpoint's own. Remaining keyword arguments go to :func:`score_predictions`.

    Raises:
        EvalError: the generator returned the wrong number of outputs.
    """
    task_obj = task if isinstance(task, Task) else get_task(task, **dict(task_options or {}))
    trained = _trained_template(checkpoint)
    if trained is not None:
        task_obj.use_trained_template(trained)
    problems = task_obj.problems()[:limit] if limit is not None else task_obj.problems()
    prompts = [task_obj.prompt(p) for p in problems]
    outputs, sample = _generate(checkpoint, prompts, sample_overrides or {}, samples, seed, batch_size, device,
                                precision, score_kwargs.get("progress", False))
    if len(outputs) != len(prompts) or any(len(o) != samples for o in outputs):
        raise EvalError(f"generation returned {len(outputs)} lists for {len(prompts)} prompts "
                        f"(expected {samples} outputs each)")
    records = [
        {"task_id": p["task_id"], "solution": str(text), "seed": seed + j}
        for p, outs in zip(problems, outputs, strict=True)
        for j, text in enumerate(outs)
    ]
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_jsonl(Path(out_dir) / "predictions.jsonl", records)
    config = {"checkpoint": checkpoint, "samples": samples, "seed": seed, "sample": sample}
    config.update(score_kwargs.pop("config", None) or {})
    return score_predictions(task_obj, records, limit=limit, out_dir=out_dir, config=config, **score_kwargs)
