"""Prompts (strings) → answers (strings): batching, seeds, the frozen encoder and decoding.

Each (prompt i, sample j) pair is one *job* with seed ``seed + j``; its noise and time grid come
from generators seeded by that value alone, so a job's answer does not depend on which other
jobs share its batch. Jobs are run in batches of ``batch_size`` (prompt-major order); the frozen
encoder runs once per batch over the distinct prompts in it (prompts of different lengths share a
batch: the canvas has a fixed length, and the answer region of each starts after its own prompt).
The encoder is causal, so the canvas with EOS placeholders in the answer region gives the same
prompt states as training. The teacher is never loaded or called.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from ..device import use_bf16
from ..model.student import Student
from ..text.load import FrozenText
from .decoding import answer_text, answer_token_ids
from .network import Network, StudentNetwork, as_network
from .options import SamplingOptions
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
    trajectory: Trajectory | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        """JSON-ready fields (the trajectory is left out)."""
        out = asdict(self)
        out.pop("trajectory")
        return out


def _device_of(net: Network) -> torch.device:
    if isinstance(net, StudentNetwork):
        return net.device
    return torch.device(getattr(net, "device", "cpu"))


def generate_with_options(model: Student | Network, frozen_text: FrozenText, prompts: list[str],
                          options: SamplingOptions, samples: int = 1, seed: int = 0,
                          answer_key: AnswerKey | None = None, batch_size: int = 8, precision: str = "auto",
                          record_every: int = 0, progress: bool = True) -> list[GenerationResult]:
    """:func:`generate` with the sampler settings as one :class:`SamplingOptions`.

    ``record_every`` > 0 attaches a :class:`Trajectory` to every result.
    """
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not a string")
    if samples < 1:
        raise ValueError(f"samples must be >= 1; got {samples}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    tokenizer, eos = frozen_text.tokenizer, frozen_text.tokenizer.eos_token_id
    if isinstance(model, Student):
        device = next(model.parameters()).device
        net = StudentNetwork(model, use_bf16(device, precision), eos_id=eos)
    else:
        net = as_network(model)
        device = _device_of(net)

    compare = answer_key or (lambda text: text)  # adaptive exit compares the full text by default

    def check_key(_row: int, ids: torch.Tensor) -> Hashable:
        return compare(answer_text(tokenizer, answer_token_ids(ids, eos)))

    jobs = [(i, j) for i in range(len(prompts)) for j in range(samples)]
    batches = [jobs[k:k + batch_size] for k in range(0, len(jobs), batch_size)]
    results: list[GenerationResult] = []
    for batch in tqdm(batches, desc=f"sample ({options.sampler}, {options.nfe} NFE)", disable=not progress,
                      dynamic_ncols=True):
        distinct = sorted({i for i, _ in batch})
        canvas = frozen_text.canvas.build([prompts[i] for i in distinct])
        states = frozen_text.encoder.encode(canvas.tokens).to(device)
        where = {i: k for k, i in enumerate(distinct)}
        pick = torch.tensor([where[i] for i, _ in batch], device=device)
        prompt_mask = canvas.prompt_mask.to(device)[pick]
        seeds = [seed + j for _, j in batch]
        out = run_sampler(net, states[pick], prompt_mask, seeds, options, answer_key=check_key,
                          record_every=record_every)
        for k, (i, j) in enumerate(batch):
            tokens = answer_token_ids(out.token_ids[k], eos)
            results.append(GenerationResult(
                prompt_index=i, sample_index=j, seed=seeds[k], text=answer_text(tokenizer, tokens), tokens=tokens,
                nfe=int(out.nfe[k]), nfe_budget=options.nfe, denoiser_calls=int(out.denoiser_calls[k]),
                decoder_calls=int(out.decoder_calls[k]), steps=int(out.steps[k]),
                exit_time=float(out.exit_time[k]), early_exit=bool(out.early_exit[k]), sampler=options.sampler,
                trajectory=None if out.trajectories is None else out.trajectories[k]))
    return results


_D = SamplingOptions()  # defaults, from the config dataclasses


def generate(model: Student | Network, frozen_text: FrozenText, prompts: list[str], nfe: int = _D.nfe,
             sampler: str = _D.sampler, samples: int = 1, seed: int = 0, *, sc_cfg: float = _D.sc_cfg,
             prompt_cfg: float = _D.prompt_cfg, rho: int = _D.rho, renoise_eta: float = _D.renoise_eta,
             renoise_power: float = _D.renoise_power, adaptive_patience: int = _D.adaptive_patience,
             adaptive_interval: int = _D.adaptive_interval, answer_key: AnswerKey | None = None,
             sigma: float = _D.sigma, c_min: float = _D.c_min, batch_size: int = 8, precision: str = "auto",
             record_trajectory: bool = False, record_every: int = 1,
             progress: bool = True) -> list[GenerationResult]:
    """Generate ``samples`` answers for each prompt (spec §4).

    Returns one :class:`GenerationResult` per (prompt, sample), prompt-major; sample j of every
    prompt uses seed ``seed + j``. ``sampler`` is one of early-stop (default; Eq. 12 on the prefix
    of the ρ·N master grid, decode D(d_{N−2})), full-span, renoise or adaptive (§8, with
    ``answer_key`` mapping an answer text to what is compared between checks; default the whole
    text). ``sc_cfg`` is the SC-CFG scale w fed to the network; ``prompt_cfg`` ≠ 1 doubles the
    calls per step (prompt-dropped pass, inference-only). ``sigma`` and ``c_min`` must match the
    checkpoint's flow config (:func:`elfreg.sampling.api.generate_from_checkpoint` passes them).
    Device and precision follow the student: ``precision`` auto uses bf16 autocast only where the
    hardware has fast bf16. With ``record_trajectory`` every result carries a Trajectory of every
    ``record_every``-th step.
    """
    options = SamplingOptions(sampler=sampler, nfe=nfe, rho=rho, sc_cfg=sc_cfg, prompt_cfg=prompt_cfg,
                              renoise_eta=renoise_eta, renoise_power=renoise_power,
                              adaptive_patience=adaptive_patience, adaptive_interval=adaptive_interval,
                              sigma=sigma, c_min=c_min)
    return generate_with_options(model, frozen_text, prompts, options, samples=samples, seed=seed,
                                 answer_key=answer_key, batch_size=batch_size, precision=precision,
                                 record_every=record_every if record_trajectory else 0, progress=progress)
