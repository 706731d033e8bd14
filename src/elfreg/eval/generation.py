"""Generation from a checkpoint, then scoring: the path of ``elfreg eval --checkpoint``.

Contract of :func:`evaluate_checkpoint`:

* the checkpoint is found (:func:`require_checkpoint`) and the sampler settings resolved (the
  checkpoint's ``sample`` section with ``sample_overrides`` applied) before the task's data is
  loaded; prompts use the template the checkpoint was trained with (``data.template``, see
  :meth:`~elfreg.eval.tasks.base.Task.use_trained_template`) unless one was given; the output
  folder is checked, locked and given its identity (:func:`elfreg.runs.claimed`) before
  any model is loaded;
* sample ``j`` of every prompt is generated with seed ``seed + j``, in chunks of whole prompts
  (``lcm(batch_size, samples)`` jobs, so every chunk is made of whole batches and the batches
  are those of a single call); :func:`_generate` is the eval room's only call into the sampling
  room;
* each (task_id, seed) record is appended to ``predictions.jsonl`` as soon as its chunk is done,
  and a rerun into the same folder skips every pair already there (a chunk with any pair
  missing is generated whole again and only the missing pairs are appended, so the texts are
  those of an uninterrupted run), then scores all of them;
* after each chunk ``should_stop`` is asked: when true, :class:`EvalStopped` says how many pairs
  are saved; during scoring it stops new checks and the partial report says ``complete: false``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from elfreg.checkpoint import open_checkpoint, resolve_checkpoint
from elfreg.config import SampleConfig
from elfreg.jsonl import append_jsonl, drop_cut_last_line
from elfreg.runs import claimed

from .predictions import read_predictions
from .rank_pool import RankPool
from .reporting import EVAL_FOLDER, PREDICTIONS_NAME, EvalError, EvalReport, EvalStopped, progress_bar
from .scoring import score_predictions
from .tasks import Task, get_task

__all__ = ["EvalError", "EvalStopped", "evaluate_checkpoint", "require_checkpoint"]

log = logging.getLogger(__name__)

Pair = tuple[str, int]  # (task_id, seed)


def _generate(checkpoint: Path, prompts: list[str], sample: SampleConfig, samples: int, seed: int,
              batch_size: int, device: str, precision: str) -> list[list[str]]:
    """``outputs[prompt][j]``: the text of each prompt with seed ``seed + j`` (the only call into
    the sampling room; the loaded checkpoint stays in memory between calls)."""
    from elfreg.sampling import generate, load_checkpoint

    models = load_checkpoint(checkpoint, device, precision)
    outputs: list[list[str]] = [[] for _ in prompts]
    for r in generate(models, prompts, sample, samples=samples, seed=seed, batch_size=batch_size, progress=False):
        outputs[r.prompt_index].append(r.text)
    return outputs


def require_checkpoint(checkpoint: str | os.PathLike) -> Path:
    """The checkpoint folder that ``checkpoint`` names (a run folder gives its latest).

    Raises:
        EvalError: there is none (the message names the path).
    """
    found = resolve_checkpoint(checkpoint)
    if found is None:
        raise EvalError(f"no checkpoint at {checkpoint} (expected model.safetensors or checkpoints/latest)")
    return found.resolve()


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
    overwrite: bool = False,
    task_options: Mapping[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
    ranks: RankPool | None = None,
    **score_kwargs: Any,
) -> EvalReport:
    """Generate ``samples`` outputs per prompt from a checkpoint (resuming ``out_dir``), then score them.

    ``sample_overrides`` are ``SampleConfig`` fields (``nfe``, ``sampler``, ``sc_cfg``, …) that
    replace the checkpoint's own. ``overwrite`` replaces the results of another evaluation in
    ``out_dir``. ``ranks`` (under torchrun, on rank 0) generates one chunk per rank per round
    (:mod:`elfreg.eval.rank_pool`); the records are the same. Remaining keyword arguments go
    to :func:`score_predictions`.

    Raises:
        EvalError: no checkpoint, or the generator returned the wrong number of outputs.
        RunFolderError: an unusable or used ``out_dir``.
        EvalStopped: ``should_stop`` became true during generation (what is saved stays).
        FolderInUse: another process holds ``out_dir``.
    """
    ckpt = require_checkpoint(checkpoint)
    trained = open_checkpoint(ckpt).config
    sample = trained.sample.replace(**dict(sample_overrides or {}))
    task_obj = task if isinstance(task, Task) else get_task(task, **dict(task_options or {}))
    task_obj.use_trained_template(trained.data.template)
    identity = {"kind": "checkpoint", **task_obj.identity(), "checkpoint": str(ckpt),
                "sample": dataclasses.asdict(sample), "samples": samples, "seed": seed, "limit": limit,
                "precision": precision}
    with claimed(out_dir, identity, EVAL_FOLDER, overwrite=overwrite):
        problems = task_obj.problems()[:limit] if limit is not None else task_obj.problems()
        path = Path(out_dir) / PREDICTIONS_NAME if out_dir is not None else None
        done = _saved(path, {(p["task_id"], seed + j) for p in problems for j in range(samples)})

        def chunk_outputs(chunks: list[list[str]]) -> list[list[list[str]]]:
            jobs = [(ckpt, prompts, sample, samples, seed, batch_size, device, precision) for prompts in chunks]
            results = ranks.map(jobs) if ranks is not None else [_generate(*job) for job in jobs]
            for prompts, outputs in zip(chunks, results, strict=True):
                if len(outputs) != len(prompts) or any(len(o) != samples for o in outputs):
                    raise EvalError(f"generation returned {len(outputs)} lists for {len(prompts)} prompts "
                                    f"(expected {samples} outputs each)")
            return results

        _generate_missing(task_obj, problems, chunk_outputs, done, samples=samples, seed=seed,
                          per_chunk=max(1, math.lcm(batch_size, samples) // samples), path=path,
                          should_stop=should_stop, progress=score_kwargs.get("progress", False),
                          width=ranks.width if ranks is not None else 1)
        records = [{"task_id": p["task_id"], "solution": done[(p["task_id"], seed + j)], "seed": seed + j}
                   for p in problems for j in range(samples)]
        config = {"checkpoint": checkpoint, "checkpoint_folder": str(ckpt), "samples": samples, "seed": seed,
                  "sample": dataclasses.asdict(sample), **dict(score_kwargs.pop("config", None) or {})}
        return score_predictions(task_obj, records, limit=limit, out_dir=out_dir, config=config,
                                 should_stop=should_stop, **score_kwargs)


def _saved(path: Path | None, expected: set[Pair]) -> dict[Pair, str]:
    """The texts an earlier run of the same evaluation saved in ``path``, by (task_id, seed).

    A last line cut by a killed writer is dropped (with a warning); any other bad line raises
    :class:`~elfreg.eval.predictions.PredictionError` with its line number.
    """
    if path is None or not path.exists():
        return {}
    dropped = drop_cut_last_line(path)
    if dropped is not None:
        log.warning("%s:%d: dropped an incomplete last line (a run was killed while writing it); "
                    "its sample is generated again", path, dropped)
    done: dict[Pair, str] = {}
    for p in read_predictions(path):
        pair = (p.task_id, p.extra.get("seed"))
        if pair not in expected:
            raise EvalError(f"{path}:{p.line}: ({p.task_id}, seed {pair[1]}) is not part of this evaluation")
        done.setdefault(pair, p.text)  # type: ignore[arg-type]
    return done


def _generate_missing(task: Task, problems: list[dict[str, Any]],
                      outputs_of: Callable[[list[list[str]]], list[list[list[str]]]],
                      done: dict[Pair, str], *, samples: int, seed: int, per_chunk: int, path: Path | None,
                      should_stop: Callable[[], bool] | None, progress: bool, width: int = 1) -> None:
    """Fill ``done`` with every (task_id, seed) pair of ``problems``, chunk by chunk (``width``
    chunks a round, one per rank), appending each new record to ``path`` as soon as its round
    is done."""
    total = len(problems) * samples
    bar = progress_bar(total, "generate", progress, initial=len(done))
    stop = should_stop or (lambda: False)
    chunks = [problems[start:start + per_chunk] for start in range(0, len(problems), per_chunk)]
    pending = [c for c in chunks if any((p["task_id"], seed + j) not in done for p in c for j in range(samples))]
    try:
        for first in range(0, len(pending), width):
            if stop():
                break
            group = pending[first:first + width]
            for chunk, outputs in zip(group, outputs_of([[task.prompt(p) for p in c] for c in group]), strict=True):
                missing = [(p["task_id"], seed + j) for p in chunk for j in range(samples)
                           if (p["task_id"], seed + j) not in done]
                texts = {(p["task_id"], seed + j): str(t) for p, outs in zip(chunk, outputs, strict=True)
                         for j, t in enumerate(outs)}
                for pair in missing:
                    done[pair] = texts[pair]
                    if path is not None:
                        append_jsonl(path, {"task_id": pair[0], "solution": texts[pair], "seed": pair[1]})
                if bar is not None:
                    bar.update(len(missing))
    finally:
        if bar is not None:
            bar.close()
    if len(done) < total or stop():
        where = (f"are saved in {path}; run the same command again to resume" if path is not None
                 else "were generated but not saved (no output folder)")
        raise EvalStopped(f"generation stopped: {len(done)} of {total} (task_id, seed) pairs {where}")
