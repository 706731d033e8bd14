"""The samplers of ELF-REG §3 and App. C, and beyond the paper, all driven by one update loop (:func:`follow_path`).

Every sampler spends a budget of N NFE: N − 1 denoiser calls and one decoder call, counted by
:class:`~elfreg.sampling.network.CountingNetwork` (not by formula); adaptive exit may spend fewer.
Every sample has its own time grid (drawn from its seed), so times are per row. A sampler is a
row of :data:`SAMPLER_SPECS`: which grid, which move between network calls, what is decoded.

- **Full-span**: Eq. 12 over a grid of N points covering [0, 1]; decodes y_{N−1} (t = 1) with
  the final REG state as REG input. The grid is ELF's (``sample.full_span_grid: logit-normal``):
  0, 1 and N − 2 sorted sigmoid(N(−1.5, 0.8)) points drawn from the sample's seed, i.e. the
  early-stop master grid at ρ = 1, which ELF's sampler draws for every run; ``uniform`` spaces
  the N points evenly.
- **Prefix early-stop** (default): Eq. 12 over the first N points of the M = ρ·N master grid;
  decodes D(d_{N−2}), the last clean prediction, with the last REG prediction r̂_{N−2} as REG
  input.
- **Re-noising** (§5.1): evaluation times t_i = t★·(i/(N−2))^p, i = 0..N−2 (t★ = early-stop's last
  prediction time for the same N, ρ and grid draw); next input z_{i+1} = t_{i+1}·x̂_i +
  (1 − t_{i+1})·η·σ·ξ_i with fresh ξ_i (REG re-noised independently, prompt fixed, previous
  clean prediction as self-conditioning); decodes the last clean prediction. With η = 0 no
  fresh noise is drawn. ``sample.renoise_mode`` takes the two parts apart (Table 4/30):
  ``schedule`` runs the Euler update on the re-noising time grid, ``renoise`` re-noises on the
  early-stop grid; ``both`` is the sampler above.

- **SDE** (ELF's unconditional sampler, ``sampling_method: sde``): full-span's grid and decode,
  each step but the last first stepping back from t_j to t̃_j = α_j·t_j with
  α_j = clip(1 − γ·(t_{j+1} − t_j), 0, 1) and fresh noise, ỹ_j = α_j·y_j + (1 − α_j)·σ·ξ_j (REG
  the same with its own ξ, prompt fixed), then calling the network at (ỹ_j, t̃_j) and moving by
  Eq. 12 from t̃_j to t_{j+1}; the last step is a plain Euler step, as ELF's. γ is
  ``sample.sde_gamma`` (ELF's 1.5 at 32 steps, 1.0 at 64); γ = 0 is full-span.

``sample.reg: false`` removes REG at inference (Table 5): no REG state is sampled and the network
runs without its REG token.
- **Adaptive exit** (§8, beyond the paper): the early-stop path, stopped once the decoded answer
  has stopped changing; see :class:`~elfreg.sampling.checks.AdaptiveExit`.

``sample.trim: true`` (beyond the paper, any sampler but adaptive) runs each row on a shorter
canvas once its decoded answer end has settled; see :class:`~elfreg.sampling.checks.CanvasTrim`.

Start of every path: answer positions ~ σ·N(0, I); the REG state ~ σ·N(0, I) (REG starts from
noise, the teacher is never used); q_0 = 0 at answer positions and for REG; prompt positions hold
the clean encoder states, in the state and in the self-conditioning input alike (ELF's
``restore_cond``), and keep them at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from ..config import FlowConfig, SampleConfig
from ..model.student import Student
from .checks import AdaptiveExit, CanvasTrim, CheckKey
from .grids import early_stop_prefix, full_span_grid, grid_generator, master_grid, power_schedule
from .network import CountingNetwork, Network, as_network
from .steps import NoiseSource, euler_update, predict, renoise_input, sde_back_step, with_clean_prompt
from .trajectory import Trajectory, TrajectoryRecorder


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
    canvas_len: torch.Tensor  # (B,) canvas positions of the last calls (L unless trimmed)
    trajectories: list[Trajectory] | None = None

    @property
    def nfe(self) -> torch.Tensor:
        return self.denoiser_calls + self.decoder_calls


@dataclass
class BatchContext:
    """Everything fixed for one batch: its counted network, settings, prompt, noise and w."""

    net: CountingNetwork
    sample: SampleConfig
    flow: FlowConfig
    prompt_states: torch.Tensor  # (B, L, d), clean
    prompt_mask: torch.Tensor  # (B, L) bool
    noise: NoiseSource
    w: torch.Tensor  # (B,) SC-CFG scale
    recorder: TrajectoryRecorder | None

    @property
    def device(self) -> torch.device:
        return self.prompt_states.device

    def prompt(self, rows: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean prompt states and prompt mask of ``rows`` on canvas positions [0, n)."""
        return self.prompt_states[rows, :n], self.prompt_mask[rows, :n]

    def observe(self, rows: torch.Tensor, step: int, t: torch.Tensor, y: torch.Tensor, d: torch.Tensor,
                r: torch.Tensor | None, rd: torch.Tensor | None) -> None:
        if self.recorder is not None:
            self.recorder.observe(rows, step, t, y, d, r, rd)


@dataclass
class SamplerState:
    """Where each row of the batch stands: its current network input (y_j, or z_i when
    re-noising), its last clean prediction (the next self-conditioning input q) and the
    denoiser steps it has taken. REG parts are None for students without a REG token."""

    y: torch.Tensor
    r: torch.Tensor | None
    q: torch.Tensor
    rq: torch.Tensor | None
    steps: torch.Tensor  # (B,) long, CPU

    def rows(self, idx: torch.Tensor, n: int) -> tuple[torch.Tensor | None, ...]:
        """(y, r, q, r_q) of the rows ``idx``, text parts on canvas positions [0, n)."""
        return self.y[idx, :n], None if self.r is None else self.r[idx], self.q[idx, :n], \
            None if self.rq is None else self.rq[idx]


# What happens between two network calls: (ctx, rows, y, d, r, r̂, t_j, t_{j+1}) → next (y, r);
# the text parts hold the rows' canvas positions [0, n), n = y.shape[1].
Move = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
# What happens before a network call: (ctx, rows, y, r, t_j, t_{j+1}) → the call's input (y, r) and
# time; the move then starts from them.
BackStep = Callable[..., tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]


def euler_move(ctx: BatchContext, rows, y, d, r, rd, t, t_next):
    """Eq. 12 for the text and the REG state; prompt positions restored."""
    c_min = ctx.flow.c_min
    y = with_clean_prompt(euler_update(y, d, t, t_next, c_min), *ctx.prompt(rows, y.shape[1]))
    return y, None if r is None else euler_update(r, rd, t, t_next, c_min)


def renoise_move(ctx: BatchContext, rows, y, d, r, rd, t, t_next):
    """§5.1: the next input is the clean prediction re-noised to t_{j+1} with fresh noise."""
    eta, sigma = ctx.sample.renoise_eta, ctx.flow.sigma
    if eta == 0:
        xi, xr = torch.zeros_like(y), None if r is None else torch.zeros_like(r)
    else:
        xi = ctx.noise.normal(rows, tuple(y.shape[1:]))
        xr = None if r is None else ctx.noise.normal(rows, (r.shape[1],))
    z = with_clean_prompt(renoise_input(d, t_next, eta, sigma, xi), *ctx.prompt(rows, y.shape[1]))
    return z, None if r is None else renoise_input(rd, t_next, eta, sigma, xr)


def sde_step_back(ctx: BatchContext, rows, y, r, t, t_next):
    """ELF's SDE step, its first half (:func:`~elfreg.sampling.steps.sde_back_step`): text and REG
    stepped back to t̃_j = α_j·t_j with fresh noise of their own, prompt positions restored."""
    gamma, sigma = ctx.sample.sde_gamma, ctx.flow.sigma
    if gamma == 0:
        return y, r, t
    xi = ctx.noise.normal(rows, tuple(y.shape[1:]))
    y_back, t_back = sde_back_step(y, t, t_next, gamma, sigma, xi)
    y_back = with_clean_prompt(y_back, *ctx.prompt(rows, y.shape[1]))
    if r is not None:
        r = sde_back_step(r, t, t_next, gamma, sigma, ctx.noise.normal(rows, (r.shape[1],)))[0]
    return y_back, r, t_back


def canvas_groups(rows: torch.Tensor, length: int, trim: CanvasTrim | None) -> list[tuple[torch.Tensor, int]]:
    """``rows`` split by the canvas length they run on: one group of length L without trimming."""
    return [(rows, length)] if trim is None else trim.groups(rows)


def follow_path(ctx: BatchContext, path: SamplerState, times: torch.Tensor, move: Move,
                policy: AdaptiveExit | None = None, trim: CanvasTrim | None = None,
                back_step: BackStep | None = None) -> SamplerState:
    """The one update loop of every sampler: N − 1 network calls at ``times[:, j]`` (B, K).

    After call j a row moves to ``times[:, j + 1]`` when the grid has that point (Euler grids have
    N points, so the last call moves to the final state; the re-noising grid has N − 1, so its
    last call only predicts). ``back_step`` (ELF's SDE step) changes a call's input and time
    before it, on every step but the last, and the move starts from them. ``policy`` (adaptive
    exit) may retire rows before and after a call; retired rows are not run again. ``trim``
    (canvas trimming) sets the canvas positions [0, n) each row runs on; rows of different n are
    called separately.
    """
    b, length = ctx.prompt_mask.shape
    dev = ctx.device
    times = times.to(dev)
    active = torch.ones(b, dtype=torch.bool)
    for j in range(ctx.sample.nfe - 1):
        if policy is not None:
            active = policy.before_step(path, active)
            if not active.any():
                break
        for idx, n in canvas_groups(active.nonzero().squeeze(1), length, trim):
            di = idx.to(dev)
            y, r, q, rq = path.rows(di, n)
            t = times[di, j]
            if back_step is not None and j + 2 < times.shape[1]:
                y, r, t = back_step(ctx, di, y, r, t, times[di, j + 1])
            d, rd = predict(ctx.net, di, y, q, t.float(), ctx.w[di], ctx.prompt_mask[di, :n], r, rq,
                            ctx.sample.prompt_cfg)
            ctx.observe(di, j, t, y, d, r, rd)
            path.q[di, :n] = d
            if path.rq is not None:
                path.rq[di] = rd
            if j + 1 < times.shape[1]:
                path.y[di, :n], r_next = move(ctx, di, y, d, r, rd, t, times[di, j + 1])
                if r_next is not None:
                    path.r[di] = r_next
            path.steps[idx] += 1
        if policy is not None:
            active = policy.after_step(j, path, active)
        if trim is not None:
            trim.after_step(j, path, active)
    return path


def decode_rows(ctx: BatchContext, x: torch.Tensor, reg: torch.Tensor | None, eos_id: int | None,
                trim: CanvasTrim | None) -> torch.Tensor:
    """The final decode of every row (B, L), each on its canvas; trimmed positions hold EOS."""
    b, length = ctx.prompt_mask.shape
    ids = torch.full((b, length), -1 if eos_id is None else eos_id, dtype=torch.long)
    for idx, n in canvas_groups(torch.arange(b), length, trim):
        di = idx.to(ctx.device)
        ids[idx, :n] = ctx.net.decode(x[di, :n], ctx.prompt_mask[di, :n], None if reg is None else reg[di],
                                      ctx.w[di], rows=di).cpu()
    return ids


def _prefix_times(sample: SampleConfig, seeds: list[int]) -> torch.Tensor:
    return torch.stack([early_stop_prefix(master_grid(sample.nfe, sample.rho, grid_generator(s)), sample.nfe)
                        for s in seeds])


def _full_span_times(sample: SampleConfig, seeds: list[int]) -> torch.Tensor:
    if sample.full_span_grid == "uniform":
        return full_span_grid(sample.nfe).expand(len(seeds), sample.nfe).clone()
    return torch.stack([master_grid(sample.nfe, 1, grid_generator(s)) for s in seeds])


def _power_times(sample: SampleConfig, seeds: list[int]) -> torch.Tensor:
    t_star = _prefix_times(sample, seeds)[:, sample.nfe - 2]
    return torch.stack([power_schedule(sample.nfe, float(ts), sample.renoise_power) for ts in t_star])


@dataclass(frozen=True)
class SamplerSpec:
    times: Callable[[SampleConfig, list[int]], torch.Tensor]  # (B, K) float64 evaluation grid
    move: Move
    decodes_state: bool  # decode the final state (full-span) rather than the last prediction
    adaptive: bool = False
    back_step: BackStep | None = None  # before each call but the last (ELF's SDE step)


SAMPLER_SPECS: dict[str, SamplerSpec] = {
    "early-stop": SamplerSpec(_prefix_times, euler_move, decodes_state=False),
    "full-span": SamplerSpec(_full_span_times, euler_move, decodes_state=True),
    "renoise": SamplerSpec(_power_times, renoise_move, decodes_state=False),
    "adaptive": SamplerSpec(_prefix_times, euler_move, decodes_state=False, adaptive=True),
    "sde": SamplerSpec(_full_span_times, euler_move, decodes_state=True, back_step=sde_step_back),
}


def sampler_spec(sample: SampleConfig) -> SamplerSpec:
    """The grid, move and decode target of ``sample``'s sampler (re-noising parts applied)."""
    spec = SAMPLER_SPECS[sample.sampler]
    if sample.sampler == "renoise" and sample.renoise_mode != "both":
        schedule_only = sample.renoise_mode == "schedule"
        spec = SamplerSpec(_power_times if schedule_only else _prefix_times,
                           euler_move if schedule_only else renoise_move, decodes_state=False)
    return spec


def sampler_times(sample: SampleConfig, seeds: list[int]) -> torch.Tensor:
    """(B, K) float64 network-evaluation grid of each sample (K = N, or N − 1 on the re-noising
    schedule)."""
    return sampler_spec(sample).times(sample, seeds)


def _start(reg_dim: int | None, prompt_states: torch.Tensor, prompt_mask: torch.Tensor, noise: NoiseSource,
           sigma: float) -> SamplerState:
    b, length, dim = prompt_states.shape
    rows = torch.arange(b)
    text = sigma * noise.normal(rows, (length, dim))
    reg = sigma * noise.normal(rows, (reg_dim,)) if reg_dim else None
    y0 = torch.where(prompt_mask[..., None], prompt_states, text)
    q0 = torch.where(prompt_mask[..., None], prompt_states, torch.zeros_like(text))
    return SamplerState(y0, reg, q0, None if reg is None else torch.zeros_like(reg), torch.zeros(b, dtype=torch.long))


@torch.no_grad()
def run_sampler(net: Network | Student, prompt_states: torch.Tensor, prompt_mask: torch.Tensor, seeds: list[int],
                sample: SampleConfig, flow: FlowConfig | None = None, answer_key: CheckKey | None = None,
                record_every: int = 0, record_steps: Collection[int] = (), eos_id: int | None = None
                ) -> SamplerOutput:
    """Sample one batch: prompt states (B, L, d) with their mask (B, L), one seed per row.

    ``net`` is a :class:`Network` (a Student is wrapped in fp32 with a full argmax decode). σ and
    c_min come from ``flow`` (the checkpoint's flow config). ``answer_key`` is used by adaptive
    exit only; ``record_every`` > 0 records a :class:`Trajectory` per row (every k-th step and the
    last); ``record_steps`` records the steps j it names (and the last) instead or as well.
    ``eos_id`` is the EOS token, which canvas trimming (``sample.trim``) needs to find answer ends.
    """
    sample.validate()
    flow = flow or FlowConfig()
    b, length, _ = prompt_states.shape
    if len(seeds) != b:
        raise ValueError(f"{len(seeds)} seeds for a batch of {b}")
    if prompt_mask.shape != (b, length):
        raise ValueError(f"prompt_mask has shape {tuple(prompt_mask.shape)}, expected {(b, length)}")
    if (~prompt_mask).sum(1).min() < 1:
        raise ValueError("every canvas needs at least one answer position")
    recording = bool(record_every or record_steps)
    if sample.trim and (eos_id is None or recording):
        raise ValueError("canvas trimming needs eos_id and records no trajectories (they hold the whole canvas)")
    raw = as_network(net)
    prompt_states = prompt_states.float()
    noise = NoiseSource(seeds, prompt_states.device)
    w = torch.full((b,), float(sample.sc_cfg), device=prompt_states.device)
    recorder = TrajectoryRecorder(raw, prompt_mask, w, record_every, record_steps) if recording else None
    ctx = BatchContext(CountingNetwork(raw, b), sample, flow, prompt_states, prompt_mask, noise, w, recorder)

    spec = sampler_spec(sample)
    times = spec.times(sample, list(seeds))
    path = _start(raw.reg_dim if sample.reg else None, prompt_states, prompt_mask, noise, flow.sigma)
    policy = AdaptiveExit(ctx.net, sample, prompt_mask, w, times, answer_key) if spec.adaptive else None
    trim = CanvasTrim(ctx.net, sample, prompt_mask, w, eos_id) if sample.trim else None
    follow_path(ctx, path, times, spec.move, policy, trim, spec.back_step)
    if policy is not None:
        ids, exit_time, early = policy.finish(path)
    else:
        x, reg = (path.y, path.r) if spec.decodes_state else (path.q, path.rq)
        ids = decode_rows(ctx, x, reg, eos_id, trim)
        at = path.steps if spec.decodes_state else path.steps - 1
        exit_time = times.gather(1, at[:, None]).squeeze(1)
        early = torch.zeros(b, dtype=torch.bool)
    out = SamplerOutput(token_ids=ids, denoiser_calls=ctx.net.denoiser_calls.clone(),
                        decoder_calls=ctx.net.decoder_calls.clone(), steps=path.steps.clone(),
                        exit_time=exit_time, early_exit=early,
                        canvas_len=torch.full((b,), length) if trim is None else trim.lengths.clone())
    if recorder is not None:
        recorder.final(torch.arange(b), out.token_ids)
        info = [{"steps": int(out.steps[k]), "exit_time": float(out.exit_time[k]),
                 "early_exit": int(out.early_exit[k]), "nfe_budget": sample.nfe} for k in range(b)]
        out.trajectories = recorder.trajectories(sample.sampler, list(seeds), out.nfe, info)
    return out


