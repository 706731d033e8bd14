"""Sampling straight from a checkpoint folder (what the evaluation code and the CLI call).

Only the student (EMA weights by default), the tokenizer and the frozen encoder are loaded; the
teacher is never loaded, so a checkpoint whose teacher is gone still samples. Canvas length,
prompt cap, σ, c_min and the default sampler settings come from the checkpoint's config.
The most recently loaded checkpoint is kept in memory, so repeated calls do not reload it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import open_checkpoint
from ..config import Config
from ..device import resolve_device, use_bf16
from ..model.student import Student
from ..text.load import FrozenText, load_frozen_text
from .generation import AnswerKey, GenerationResult, generate_with_options
from .options import SamplingOptions


@dataclass
class SamplingModels:
    student: Student
    frozen: FrozenText
    config: Config
    checkpoint: Path
    device: torch.device
    precision: str


_CACHE: dict[Hashable, SamplingModels] = {}


def load_for_sampling(checkpoint: str | Path, device: str = "auto", precision: str = "auto",
                      use_ema: bool = True) -> SamplingModels:
    """Student + tokenizer + canvas builder + frozen encoder of a checkpoint (no teacher)."""
    ckpt = open_checkpoint(checkpoint)
    dev = resolve_device(device)
    key = (str(ckpt.path.resolve()), (ckpt.path / "model.safetensors").stat().st_mtime_ns, str(dev), precision,
           use_ema)
    if key in _CACHE:
        return _CACHE[key]
    bf16 = use_bf16(dev, precision)
    student = ckpt.load_student(use_ema=use_ema, device=dev)
    frozen = load_frozen_text(ckpt.config.text, with_teacher=False, device=dev, bf16=bf16)
    models = SamplingModels(student, frozen, ckpt.config, ckpt.path, dev, precision)
    _CACHE.clear()
    _CACHE[key] = models
    return models


def generate_results_from_checkpoint(checkpoint: str | Path, prompts: list[str], samples: int, nfe: int | None = None,
                                     sampler: str | None = None, seed: int = 0, *,
                                     answer_key: AnswerKey | None = None, batch_size: int = 8, device: str = "auto",
                                     precision: str = "auto", use_ema: bool = True, record_every: int = 0,
                                     progress: bool = True, **options: Any) -> list[GenerationResult]:
    """Like :func:`generate_from_checkpoint` but returns the full :class:`GenerationResult` list
    (prompt-major). ``options``: any :class:`SamplingOptions` field (sc_cfg, rho, …); unset ones
    come from the checkpoint config's ``sample`` and ``flow`` sections."""
    models = load_for_sampling(checkpoint, device, precision, use_ema)
    opts = SamplingOptions.from_config(models.config, nfe=nfe, sampler=sampler, **options)
    return generate_with_options(models.student, models.frozen, prompts, opts, samples=samples, seed=seed,
                                 answer_key=answer_key, batch_size=batch_size, precision=precision,
                                 record_every=record_every, progress=progress)


def generate_from_checkpoint(checkpoint: str, prompts: list[str], samples: int, nfe: int, sampler: str,
                             seed: int = 0, **kwargs: Any) -> list[list[str]]:
    """Answers for every prompt: ``out[i][j]`` is sample j (seed ``seed + j``) of prompt i.

    ``kwargs``: sampler settings (sc_cfg, prompt_cfg, rho, renoise_eta, renoise_power,
    adaptive_patience, adaptive_interval, answer_key) and run settings (batch_size, device,
    precision, use_ema, progress). Unset sampler settings come from the checkpoint's config.
    """
    results = generate_results_from_checkpoint(checkpoint, prompts, samples, nfe, sampler, seed, **kwargs)
    out: list[list[str]] = [[] for _ in prompts]
    for r in results:
        out[r.prompt_index].append(r.text)
    return out
