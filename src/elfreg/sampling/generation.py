"""Prompts (strings) → answers (strings): :func:`generate`, and :func:`load_checkpoint` to get what
it needs from a checkpoint folder.

Each (prompt i, sample j) pair is one *job* with seed ``seed + j``; its noise and time grid come
from generators seeded by that value alone, so a job's answer does not depend on which other
jobs share its batch. Jobs are run in batches of ``batch_size`` (prompt-major order); the frozen
encoder runs once per batch over the distinct prompts in it (prompts of different lengths share a
batch: the canvas has a fixed length, and the answer region of each starts after its own prompt).
The encoder is causal, so the canvas with EOS placeholders in the answer region gives the same
prompt states as training. The teacher is never loaded or called: a checkpoint whose teacher is
gone still samples.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..checkpoint import open_checkpoint
from ..config import Config, FlowConfig, SampleConfig
from ..device import resolve_device, use_bf16
from ..model.student import Student
from ..text.load import FrozenText, load_frozen_text
from .network import Network, StudentNetwork, as_network
from .samplers import run_sampler
from .trajectory import Trajectory

AnswerKey = Callable[[str], Hashable]


@dataclass
class GenerationResult:
    """One sample. ``nfe`` is counted (denoiser + decoder calls actually made for this sample)."""

    prompt_index: int
    sample_index: int
    seed: int
    text: str
    tokens: list[int]
    nfe: int
    nfe_budget: int  # the N the sampler was asked for
    denoiser_calls: int
    decoder_calls: int
    steps: int  # denoiser steps on the trajectory
    exit_time: float  # time of the decoded prediction (1.0 for full-span's final state)
    early_exit: bool  # adaptive exit stopped on a stable answer
    sampler: str
    canvas_len: int  # canvas positions its last network calls ran on (the whole canvas unless trimmed)
    ended: bool = True  # the answer stopped at an end token (False: it filled its answer region)
    trajectory: Trajectory | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        """JSON-ready fields (the trajectory is left out)."""
        out = asdict(self)
        out.pop("trajectory")
        return out


@dataclass
class SamplingModels:
    """What :func:`generate` needs from a checkpoint: the student (EMA weights by default), its
    tokenizer, canvas and frozen encoder (no teacher), and its config (``config.sample`` holds the
    checkpoint's sampler defaults, ``config.flow`` its σ and c_min)."""

    student: Student
    frozen: FrozenText
    config: Config
    checkpoint: Path
    precision: str


def answer_region(ids: torch.Tensor, cap: int = 0) -> list[int]:
    """The answer-region ids of one decoded row (prompt positions are −1), its first ``cap`` only
    when ``cap`` > 0 (ELF's ``gen_length``: ``text.answer_cap``)."""
    region = ids[ids >= 0].tolist()
    return region[:cap] if cap > 0 else region


def answer_token_ids(ids: torch.Tensor, eos_id: int, cap: int = 0) -> list[int]:
    """The answer of one decoded row (ELF-REG §3): the answer region (:func:`answer_region`) up to,
    not including, the first EOS."""
    answer = answer_region(ids, cap)
    return answer[: answer.index(eos_id)] if eos_id in answer else answer


def answer_text(tokenizer: PreTrainedTokenizerBase, tokens: list[int]) -> str:
    """Token ids to text, special tokens skipped."""
    return tokenizer.decode(tokens, skip_special_tokens=True)


def generate(model: SamplingModels | Student | Network, prompts: list[str], sample: SampleConfig | None = None,
             *, frozen_text: FrozenText | None = None, flow: FlowConfig | None = None, samples: int = 1,
             seed: int = 0, answer_key: AnswerKey | None = None, batch_size: int = 8, precision: str | None = None,
             record_every: int = 0, record_steps: Collection[int] = (), compile: bool = False,
             progress: bool = True) -> list[GenerationResult]:
    """Generate ``samples`` answers for each prompt (ELF-REG §3, App. C): the one generation entry point.

    ``model`` is a loaded checkpoint (:func:`load_checkpoint`; its frozen encoder, flow config,
    precision and sampler defaults are used unless given here), or a :class:`Student` /
    :class:`~elfreg.sampling.network.Network` together with ``frozen_text``. Returns one
    :class:`GenerationResult` per (prompt, sample), prompt-major; sample j of every prompt uses
    seed ``seed + j``. ``sample`` holds every sampler setting (default: the checkpoint's, else
    ``SampleConfig()``); ``flow`` gives σ and c_min and must match the training run. ``answer_key``
    maps an answer text to what adaptive exit compares between checks (default: the whole text).
    A :class:`Student` runs on its device under ``precision`` (``auto``:
    :func:`elfreg.device.resolve_precision`); any other network is used as it is.
    ``record_every`` > 0 attaches a :class:`Trajectory` of every k-th step to every result;
    ``record_steps`` (step indices j) records those steps instead or as well. ``compile`` runs a
    :class:`Student`'s forward through ``torch.compile`` (:class:`StudentNetwork`): faster calls
    at small shapes after a compile of tens of seconds, the same answers up to float rounding.
    """
    if isinstance(model, SamplingModels):
        frozen_text = frozen_text or model.frozen
        flow, precision = flow or model.config.flow, precision or model.precision
        sample = sample or model.config.sample
        model = model.student
    if frozen_text is None:
        raise TypeError("generate needs frozen_text (the tokenizer, canvas and encoder) unless given a checkpoint")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not a string")
    if samples < 1:
        raise ValueError(f"samples must be >= 1; got {samples}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    sample = (sample or SampleConfig()).validate()
    tokenizer, eos = frozen_text.tokenizer, frozen_text.tokenizer.eos_token_id
    cap = frozen_text.canvas.answer_cap
    if isinstance(model, Student):
        device = next(model.parameters()).device
        net = StudentNetwork(model, use_bf16(device, precision or "auto"), eos_id=eos, compile=compile)
    else:
        net = as_network(model)
        device = net.device if isinstance(net, StudentNetwork) else torch.device(getattr(net, "device", "cpu"))

    compare = answer_key or (lambda text: text)

    def check_key(_row: int, ids: torch.Tensor) -> Hashable:
        return compare(answer_text(tokenizer, answer_token_ids(ids, eos, cap)))

    jobs = [(i, j) for i in range(len(prompts)) for j in range(samples)]
    batches = [jobs[k:k + batch_size] for k in range(0, len(jobs), batch_size)]
    results: list[GenerationResult] = []
    for batch in tqdm(batches, desc=f"sample ({sample.sampler}, {sample.nfe} NFE)", disable=not progress,
                      dynamic_ncols=True):
        distinct = sorted({i for i, _ in batch})
        canvas = frozen_text.canvas.build([prompts[i] for i in distinct])
        states = frozen_text.encoder.encode_canvas(canvas).to(device)
        where = {i: k for k, i in enumerate(distinct)}
        pick = torch.tensor([where[i] for i, _ in batch], device=device)
        seeds = [seed + j for _, j in batch]
        out = run_sampler(net, states[pick], canvas.prompt_mask.to(device)[pick], seeds, sample, flow,
                          answer_key=check_key, record_every=record_every, record_steps=record_steps, eos_id=eos)
        for k, (i, j) in enumerate(batch):
            tokens = answer_token_ids(out.token_ids[k], eos, cap)
            region = answer_region(out.token_ids[k], cap)
            results.append(GenerationResult(
                prompt_index=i, sample_index=j, seed=seeds[k], text=answer_text(tokenizer, tokens), tokens=tokens,
                nfe=int(out.nfe[k]), nfe_budget=sample.nfe, denoiser_calls=int(out.denoiser_calls[k]),
                decoder_calls=int(out.decoder_calls[k]), steps=int(out.steps[k]),
                exit_time=float(out.exit_time[k]), early_exit=bool(out.early_exit[k]), sampler=sample.sampler,
                canvas_len=int(out.canvas_len[k]), ended=eos in region,
                trajectory=None if out.trajectories is None else out.trajectories[k]))
    return results


_LOADED: dict[Hashable, SamplingModels] = {}


def load_checkpoint(checkpoint: str | Path, device: str = "auto", precision: str = "auto",
                    use_ema: bool = True) -> SamplingModels:
    """Load a checkpoint for sampling; the most recently loaded one stays in memory, so repeated
    calls (an evaluation per NFE, say) do not reload it. A ``tokenizer/`` folder inside the
    checkpoint (a release written by ``elfreg export``) is the tokenizer used."""
    ckpt = open_checkpoint(checkpoint)
    dev = resolve_device(device)
    key = (str(ckpt.path.resolve()), (ckpt.path / "meta.json").stat().st_mtime_ns, str(dev), precision,
           use_ema)
    if key not in _LOADED:
        student = ckpt.load_student(use_ema=use_ema, device=dev)
        text = ckpt.config.text
        if (ckpt.path / "tokenizer").is_dir():
            text = replace(text, tokenizer=str(ckpt.path / "tokenizer"))
        frozen = load_frozen_text(text, with_teacher=False, device=dev, bf16=use_bf16(dev, precision))
        _LOADED.clear()
        _LOADED[key] = SamplingModels(student, frozen, ckpt.config, ckpt.path, precision)
    return _LOADED[key]
