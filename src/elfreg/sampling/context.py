"""What every sampler starts from: the batch, its counted network, its noise and y_0 (spec §4).

Start: answer positions ~ σ·N(0, I); the REG state ~ σ·N(0, I) (REG starts from noise, the teacher
is never used); self-conditioning q_0 = 0; prompt positions hold the clean encoder states and
keep them at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from .counting import CountingNetwork
from .network import Network
from .noise import NoiseSource
from .options import SamplingOptions
from .trajectory import Trajectory, TrajectoryRecorder

# (sample index in the batch, (L,) argmax ids of a decode) → the key compared by adaptive exit.
CheckKey = Callable[[int, torch.Tensor], Hashable]


@dataclass
class SamplerOutput:
    """Result of one batch. ``token_ids`` are the raw argmax rows of the final decode (B, L), −1 at
    prompt positions; the answer is the prefix of the answer region before the first EOS."""

    token_ids: torch.Tensor
    denoiser_calls: torch.Tensor  # (B,) counted denoiser calls
    decoder_calls: torch.Tensor  # (B,) counted decoder calls
    steps: torch.Tensor  # (B,) denoiser steps taken on the trajectory
    exit_time: torch.Tensor  # (B,) float64 time of the decoded prediction (1.0 for full-span)
    early_exit: torch.Tensor  # (B,) bool: adaptive exit stopped on a stable answer
    trajectories: list[Trajectory] | None = None

    @property
    def nfe(self) -> torch.Tensor:
        return self.denoiser_calls + self.decoder_calls


@dataclass
class BatchContext:
    net: CountingNetwork
    raw_net: Network  # uncounted: used only for trajectory decodes
    options: SamplingOptions
    prompt_states: torch.Tensor  # (B, L, d)
    prompt_mask: torch.Tensor  # (B, L) bool
    seeds: list[int]
    noise: NoiseSource
    w: torch.Tensor  # (B,) SC-CFG scale
    y0: torch.Tensor  # (B, L, d) initial text state
    r0: torch.Tensor | None  # (B, d_r) initial REG state
    recorder: TrajectoryRecorder | None

    @property
    def device(self) -> torch.device:
        return self.prompt_states.device

    @property
    def batch(self) -> int:
        return self.prompt_states.shape[0]

    @property
    def rows(self) -> torch.Tensor:
        return torch.arange(self.batch, device=self.device)

    def observe(self, rows: torch.Tensor, step: int, t: torch.Tensor, y: torch.Tensor, d: torch.Tensor,
                r: torch.Tensor | None, rd: torch.Tensor | None) -> None:
        if self.recorder is not None:
            self.recorder.observe(rows, step, t, y, d, r, rd)


def make_context(net: Network, prompt_states: torch.Tensor, prompt_mask: torch.Tensor, seeds: list[int],
                 options: SamplingOptions, record_every: int = 0) -> BatchContext:
    """Counted network, per-sample noise and y_0 for a batch (``record_every`` 0: no recording)."""
    b, length, dim = prompt_states.shape
    if len(seeds) != b:
        raise ValueError(f"{len(seeds)} seeds for a batch of {b}")
    if prompt_mask.shape != (b, length):
        raise ValueError(f"prompt_mask has shape {tuple(prompt_mask.shape)}, expected {(b, length)}")
    if (~prompt_mask).sum(1).min() < 1:
        raise ValueError("every canvas needs at least one answer position")
    device = prompt_states.device
    prompt_states = prompt_states.float()
    noise = NoiseSource(seeds, device)
    rows = torch.arange(b, device=device)
    text = options.sigma * noise.normal(rows, (length, dim))
    reg = options.sigma * noise.normal(rows, (net.reg_dim,)) if net.reg_dim else None
    y0 = torch.where(prompt_mask[..., None], prompt_states, text)
    w = torch.full((b,), float(options.sc_cfg), device=device)
    recorder = TrajectoryRecorder(net, prompt_mask, w, record_every) if record_every else None
    return BatchContext(CountingNetwork(net, b), net, options, prompt_states, prompt_mask, list(seeds), noise, w,
                        y0, reg, recorder)
