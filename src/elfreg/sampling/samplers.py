"""The samplers of spec §4 and §8, all driven by one update loop (:func:`follow_path`).

Every sampler spends a budget of N NFE: N − 1 denoiser calls and one decoder call, counted by
:class:`~elfreg.sampling.network.CountingNetwork` (not by formula); adaptive exit may spend fewer.
Every sample has its own time grid (drawn from its seed), so times are per row. A sampler is a
row of :data:`SAMPLER_SPECS`: which grid, which move between network calls, what is decoded.

- **Full-span**: Eq. 12 over the uniform grid of N points on [0, 1]; decodes y_{N−1} (t = 1) with
  the final REG state as REG input.
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

``sample.reg: false`` removes REG at inference (Table 5): no REG state is sampled and the network
runs without its REG token.
- **Adaptive exit** (§8, beyond the paper): the early-stop path, stopped once the decoded answer
  has stopped changing; see :class:`AdaptiveExit`.

Start of every path: answer positions ~ σ·N(0, I); the REG state ~ σ·N(0, I) (REG starts from
noise, the teacher is never used); q_0 = 0; prompt positions hold the clean encoder states and
keep them at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass

import torch

from ..config import FlowConfig, SampleConfig
from ..model.student import Student
from .grids import early_stop_prefix, full_span_grid, grid_generator, master_grid, power_schedule
from .network import CountingNetwork, Network, as_network
from .steps import NoiseSource, euler_update, predict, renoise_input, with_clean_prompt
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

    def observe(self, rows: torch.Tensor, step: int, t: torch.Tensor, y: torch.Tensor, d: torch.Tensor,
                r: torch.Tensor | None, rd: torch.Tensor | None) -> None:
        if self.recorder is not None:
            self.recorder.observe(rows, step, t, y, d, r, rd)


@dataclass
class Path:
    """Where each row of the batch stands: its current network input (y_j, or z_i when
    re-noising), its last clean prediction (the next self-conditioning input q) and the
    denoiser steps it has taken. REG parts are None for students without a REG token."""

    y: torch.Tensor
    r: torch.Tensor | None
    q: torch.Tensor
    rq: torch.Tensor | None
    steps: torch.Tensor  # (B,) long, CPU

    def rows(self, idx: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """(y, r, q, r_q) of the rows ``idx``."""
        return tuple(None if x is None else x[idx] for x in (self.y, self.r, self.q, self.rq))


# What happens between two network calls: (ctx, rows, y, d, r, r̂, t_j, t_{j+1}) → next (y, r).
Move = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def euler_move(ctx: BatchContext, rows, y, d, r, rd, t, t_next):
    """Eq. 12 for the text and the REG state; prompt positions restored."""
    c_min = ctx.flow.c_min
    y = with_clean_prompt(euler_update(y, d, t, t_next, c_min), ctx.prompt_states[rows], ctx.prompt_mask[rows])
    return y, None if r is None else euler_update(r, rd, t, t_next, c_min)


def renoise_move(ctx: BatchContext, rows, y, d, r, rd, t, t_next):
    """§5.1: the next input is the clean prediction re-noised to t_{j+1} with fresh noise."""
    eta, sigma = ctx.sample.renoise_eta, ctx.flow.sigma
    if eta == 0:
        xi, xr = torch.zeros_like(y), None if r is None else torch.zeros_like(r)
    else:
        xi = ctx.noise.normal(rows, tuple(y.shape[1:]))
        xr = None if r is None else ctx.noise.normal(rows, (r.shape[1],))
    z = with_clean_prompt(renoise_input(d, t_next, eta, sigma, xi), ctx.prompt_states[rows], ctx.prompt_mask[rows])
    return z, None if r is None else renoise_input(rd, t_next, eta, sigma, xr)


def follow_path(ctx: BatchContext, path: Path, times: torch.Tensor, move: Move,
                policy: AdaptiveExit | None = None) -> Path:
    """The one update loop of every sampler: N − 1 network calls at ``times[:, j]`` (B, K).

    After call j a row moves to ``times[:, j + 1]`` when the grid has that point (Euler grids have
    N points, so the last call moves to the final state; the re-noising grid has N − 1, so its
    last call only predicts). ``policy`` (adaptive exit) may retire rows before and after a call;
    retired rows are not run again.
    """
    b, dev = ctx.prompt_mask.shape[0], ctx.device
    times = times.to(dev)
    active = torch.ones(b, dtype=torch.bool)
    for j in range(ctx.sample.nfe - 1):
        if policy is not None:
            active = policy.before_step(path, active)
            if not active.any():
                break
        idx = active.nonzero().squeeze(1)
        di = idx.to(dev)
        y, r, q, rq = path.rows(di)
        t = times[di, j]
        d, rd = predict(ctx.net, di, y, q, t.float(), ctx.w[di], ctx.prompt_mask[di], r, rq, ctx.sample.prompt_cfg)
        ctx.observe(di, j, t, y, d, r, rd)
        path.q[di] = d
        if path.rq is not None:
            path.rq[di] = rd
        if j + 1 < times.shape[1]:
            path.y[di], r_next = move(ctx, di, y, d, r, rd, t, times[di, j + 1])
            if r_next is not None:
                path.r[di] = r_next
        path.steps[idx] += 1
        if policy is not None:
            active = policy.after_step(j, path, active)
    return path


# (sample index in the batch, (L,) argmax ids of a decode) → the key compared by adaptive exit.
CheckKey = Callable[[int, torch.Tensor], Hashable]


def _whole_answer(_row: int, ids: torch.Tensor) -> Hashable:
    return tuple(ids[ids >= 0].tolist())


def checks_to_exit(streak: torch.Tensor, has_ref: torch.Tensor, patience: int) -> torch.Tensor:
    """The fewest further checks (this one included) that could end the run."""
    return torch.where(has_ref, patience - streak, torch.full_like(streak, patience + 1))


def exit_cost(step: int, interval: int, checks_made: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """Calls spent by the earliest possible exit when a check is due after denoiser step ``step``:
    denoiser steps up to the last needed check plus every check made by then."""
    return (step + (need - 1) * interval + 1) + checks_made + need


class AdaptiveExit:
    """Adaptive exit (spec §8): stop a sample when its decoded answer stops changing.

    After every K-th denoiser step (``adaptive_interval``) a row may *check*: decode its current
    clean prediction d_j (one decoder call, counted as NFE) and compare its key —
    ``answer_key(row, ids)``, e.g. the extracted final number for math, by default the whole
    answer — with the key of its previous check. A check whose key equals the previous one extends
    the streak, any other resets it; when the streak reaches ``patience`` the row stops and returns
    that decode (no further call).

    Budget rule (never more than N calls, checks included): one call is always kept for the final
    decode, so a denoiser step is taken only if ``used + 2 ≤ N``. A check is made only if the exit
    it could lead to is still affordable: the fewest checks that could end the run from here
    (patience − streak, or patience + 1 before the first check), K steps apart, must fit in the
    budget; once unaffordable a stop never becomes affordable again. Consequences: with patience
    larger than the budget no check is made and the sampler is exactly early-stop; a row that does
    not stop decodes its last clean prediction (reusing the decode of a check made on that same
    prediction, at no cost). Each row reports the calls it actually used.
    """

    def __init__(self, net: CountingNetwork, sample: SampleConfig, prompt_mask: torch.Tensor, w: torch.Tensor,
                 times: torch.Tensor, answer_key: CheckKey | None = None):
        self.net, self.prompt_mask, self.w, self.times = net, prompt_mask, w, times
        self.key = answer_key or _whole_answer
        self.n, self.interval, self.patience = sample.nfe, sample.adaptive_interval, sample.adaptive_patience
        b, length = prompt_mask.shape
        self.active = torch.ones(b, dtype=torch.bool)
        self.checks = torch.zeros(b, dtype=torch.long)
        self.streak = torch.zeros(b, dtype=torch.long)
        self.has_ref = torch.zeros(b, dtype=torch.bool)
        self.checked_last = torch.zeros(b, dtype=torch.bool)  # the current q was decoded by a check
        self.early = torch.zeros(b, dtype=torch.bool)
        self.refs: list[Hashable | None] = [None] * b
        self.last_ids = torch.full((b, length), -1, dtype=torch.long)
        self.final_ids = torch.full((b, length), -1, dtype=torch.long)
        self.exit_time = torch.zeros(b, dtype=torch.float64)

    def _decode(self, path: Path, rows: torch.Tensor) -> torch.Tensor:
        di = rows.to(self.prompt_mask.device)
        reg = None if path.rq is None else path.rq[di]
        return self.net.decode(path.q[di], self.prompt_mask[di], reg, self.w[di], rows=di).cpu()

    def _retire(self, path: Path, mask: torch.Tensor) -> None:
        """Final answer of the rows in ``mask``: their last clean prediction, decoded once."""
        reuse = mask & self.checked_last
        self.final_ids[reuse] = self.last_ids[reuse]
        todo = (mask & ~self.checked_last).nonzero().squeeze(1)
        if todo.numel():
            self.final_ids[todo] = self._decode(path, todo)
        done = mask.nonzero().squeeze(1)
        at = (path.steps[done] - 1).clamp(min=0)
        self.exit_time[done] = self.times[done.to(self.times.device), at.to(self.times.device)].cpu()
        self.active &= ~mask

    def before_step(self, path: Path, active: torch.Tensor) -> torch.Tensor:
        affordable = active & (self.net.nfe + 2 <= self.n)
        self._retire(path, active & ~affordable)
        return self.active.clone()

    def after_step(self, j: int, path: Path, active: torch.Tensor) -> torch.Tensor:
        self.checked_last[active] = False
        if (j + 1) % self.interval:
            return self.active.clone()
        need = checks_to_exit(self.streak, self.has_ref, self.patience)
        due = active & (exit_cost(j, self.interval, self.checks, need) <= self.n)
        rows = due.nonzero().squeeze(1)
        if rows.numel():
            ids = self._decode(path, rows)
            for k, row in enumerate(rows.tolist()):
                key = self.key(row, ids[k])
                same = bool(self.has_ref[row]) and key == self.refs[row]
                self.streak[row] = self.streak[row] + 1 if same else 0
                self.refs[row], self.has_ref[row] = key, True
            self.checks[rows] += 1
            self.checked_last[rows] = True
            self.last_ids[rows] = ids
            stop = due & (self.streak >= self.patience)
            self.early |= stop
            self._retire(path, stop)
        return self.active.clone()

    def finish(self, path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Retire the rows still running; (token ids, exit times, early-exit flags)."""
        self._retire(path, self.active.clone())
        return self.final_ids, self.exit_time, self.early


def _prefix_times(sample: SampleConfig, seeds: list[int]) -> torch.Tensor:
    return torch.stack([early_stop_prefix(master_grid(sample.nfe, sample.rho, grid_generator(s)), sample.nfe)
                        for s in seeds])


def _uniform_times(sample: SampleConfig, seeds: list[int]) -> torch.Tensor:
    return full_span_grid(sample.nfe).expand(len(seeds), sample.nfe).clone()


def _power_times(sample: SampleConfig, seeds: list[int]) -> torch.Tensor:
    t_star = _prefix_times(sample, seeds)[:, sample.nfe - 2]
    return torch.stack([power_schedule(sample.nfe, float(ts), sample.renoise_power) for ts in t_star])


@dataclass(frozen=True)
class SamplerSpec:
    times: Callable[[SampleConfig, list[int]], torch.Tensor]  # (B, K) float64 evaluation grid
    move: Move
    decodes_state: bool  # decode the final state (full-span) rather than the last prediction
    adaptive: bool = False


SAMPLER_SPECS: dict[str, SamplerSpec] = {
    "early-stop": SamplerSpec(_prefix_times, euler_move, decodes_state=False),
    "full-span": SamplerSpec(_uniform_times, euler_move, decodes_state=True),
    "renoise": SamplerSpec(_power_times, renoise_move, decodes_state=False),
    "adaptive": SamplerSpec(_prefix_times, euler_move, decodes_state=False, adaptive=True),
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
           sigma: float) -> Path:
    b, length, dim = prompt_states.shape
    rows = torch.arange(b)
    text = sigma * noise.normal(rows, (length, dim))
    reg = sigma * noise.normal(rows, (reg_dim,)) if reg_dim else None
    y0 = torch.where(prompt_mask[..., None], prompt_states, text)
    return Path(y0, reg, torch.zeros_like(y0), None if reg is None else torch.zeros_like(reg),
                torch.zeros(b, dtype=torch.long))


@torch.no_grad()
def run_sampler(net: Network | Student, prompt_states: torch.Tensor, prompt_mask: torch.Tensor, seeds: list[int],
                sample: SampleConfig, flow: FlowConfig | None = None, answer_key: CheckKey | None = None,
                record_every: int = 0, record_steps: Collection[int] = ()) -> SamplerOutput:
    """Sample one batch: prompt states (B, L, d) with their mask (B, L), one seed per row.

    ``net`` is a :class:`Network` (a Student is wrapped in fp32 with a full argmax decode). σ and
    c_min come from ``flow`` (the checkpoint's flow config). ``answer_key`` is used by adaptive
    exit only; ``record_every`` > 0 records a :class:`Trajectory` per row (every k-th step and the
    last); ``record_steps`` records the steps j it names (and the last) instead or as well.
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
    raw = as_network(net)
    prompt_states = prompt_states.float()
    noise = NoiseSource(seeds, prompt_states.device)
    w = torch.full((b,), float(sample.sc_cfg), device=prompt_states.device)
    recording = bool(record_every or record_steps)
    recorder = TrajectoryRecorder(raw, prompt_mask, w, record_every, record_steps) if recording else None
    ctx = BatchContext(CountingNetwork(raw, b), sample, flow, prompt_states, prompt_mask, noise, w, recorder)

    spec = sampler_spec(sample)
    times = spec.times(sample, list(seeds))
    path = _start(raw.reg_dim if sample.reg else None, prompt_states, prompt_mask, noise, flow.sigma)
    policy = AdaptiveExit(ctx.net, sample, prompt_mask, w, times, answer_key) if spec.adaptive else None
    follow_path(ctx, path, times, spec.move, policy)
    if policy is not None:
        ids, exit_time, early = policy.finish(path)
    else:
        x, reg = (path.y, path.r) if spec.decodes_state else (path.q, path.rq)
        ids = ctx.net.decode(x, prompt_mask, reg, w, rows=torch.arange(b, device=prompt_states.device)).cpu()
        at = path.steps if spec.decodes_state else path.steps - 1
        exit_time = times.gather(1, at[:, None]).squeeze(1)
        early = torch.zeros(b, dtype=torch.bool)
    out = SamplerOutput(token_ids=ids, denoiser_calls=ctx.net.denoiser_calls.clone(),
                        decoder_calls=ctx.net.decoder_calls.clone(), steps=path.steps.clone(),
                        exit_time=exit_time, early_exit=early)
    if recorder is not None:
        recorder.final(torch.arange(b), out.token_ids)
        info = [{"steps": int(out.steps[k]), "exit_time": float(out.exit_time[k]),
                 "early_exit": int(out.early_exit[k]), "nfe_budget": sample.nfe} for k in range(b)]
        out.trajectories = recorder.trajectories(sample.sampler, list(seeds), out.nfe, info)
    return out


