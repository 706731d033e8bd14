"""The samplers of spec §4: full-span, prefix early-stop and clean-prediction re-noising.

All three spend N NFE on a budget of N: N − 1 denoiser calls and one decoder call, counted by
:class:`~elfreg.sampling.counting.CountingNetwork` (not by formula). Every sample has its own
time grid (drawn from its seed), so times are per row.

- **Full-span**: Eq. 12 over the uniform grid of N points on [0, 1]; decodes y_{N−1} (t = 1) with
  the final REG state as REG input.
- **Prefix early-stop** (default): Eq. 12 over the first N points of the M = ρ·N master grid;
  decodes D(d_{N−2}), the last clean prediction, with the last REG prediction r̂_{N−2} as REG
  input.
- **Re-noising** (§5.1): evaluation times t_i = t★·(i/(N−2))^p, i = 0..N−2 (t★ = early-stop's last
  prediction time for the same N, ρ and grid draw); next input z_{i+1} = t_{i+1}·x̂_i +
  (1 − t_{i+1})·η·σ·ξ_i with fresh ξ_i (REG re-noised independently, prompt fixed, previous
  clean prediction as self-conditioning); decodes the last clean prediction. With η = 0 no
  fresh noise is drawn and every step after the first is a deterministic function of x̂.
- **Adaptive exit** (§8): see :mod:`elfreg.sampling.adaptive`.
"""

from __future__ import annotations

import torch

from ..model.student import Student
from .adaptive import run_adaptive
from .context import BatchContext, CheckKey, SamplerOutput, make_context
from .grids import early_stop_prefix, full_span_grid, grid_generator, master_grid, power_schedule
from .network import Network, as_network
from .options import SamplingOptions
from .updates import euler_update, predict, renoise_input, with_clean_prompt


def master_grids(seeds: list[int], nfe: int, rho: int) -> torch.Tensor:
    """(B, ρ·N) float64 master grids, one per sample seed (see :func:`grids.grid_generator`)."""
    return torch.stack([master_grid(nfe, rho, grid_generator(s)) for s in seeds])


def sampler_times(options: SamplingOptions, seeds: list[int]) -> torch.Tensor:
    """(B, K) float64 network-evaluation grid of each sample.

    Early-stop and adaptive: the first N master-grid points (K = N; the last point only closes
    the final Euler update). Full-span: the uniform N-point grid. Re-noising: the N − 1 power-
    schedule times ending at t★.
    """
    n = options.nfe
    if options.sampler == "full-span":
        return full_span_grid(n).expand(len(seeds), n).clone()
    masters = master_grids(seeds, n, options.rho)
    if options.sampler in ("early-stop", "adaptive"):
        return torch.stack([early_stop_prefix(m, n) for m in masters])
    t_star = masters[:, n - 2]
    return torch.stack([power_schedule(n, float(ts), options.renoise_power) for ts in t_star])


def euler_path(ctx: BatchContext, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                torch.Tensor, torch.Tensor | None]:
    """Eq. 12 over the per-row grid ``times`` (B, K): K − 1 denoiser calls.

    Returns (y_{K−1}, r_{K−1}, d_{K−2}, r̂_{K−2}): the final joint state and the last clean
    prediction.
    """
    opt, rows = ctx.options, ctx.rows
    times = times.to(ctx.device)
    y, r = ctx.y0, ctx.r0
    q = torch.zeros_like(y)
    rq = None if r is None else torch.zeros_like(r)
    d, rd = q, rq
    for j in range(times.shape[1] - 1):
        t, t_next = times[:, j], times[:, j + 1]
        d, rd = predict(ctx.net, rows, y, q, t.float(), ctx.w, ctx.prompt_mask, r, rq, opt.prompt_cfg)
        ctx.observe(rows, j, t, y, d, r, rd)
        y = with_clean_prompt(euler_update(y, d, t, t_next, opt.c_min), ctx.prompt_states, ctx.prompt_mask)
        if r is not None:
            r = euler_update(r, rd, t, t_next, opt.c_min)
        q, rq = d, rd
    return y, r, d, rd


def renoise_path(ctx: BatchContext, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The re-noising sampler over ``times`` (B, N − 1); returns the last clean predictions."""
    opt, rows = ctx.options, ctx.rows
    times = times.to(ctx.device)
    length, dim = ctx.y0.shape[1:]
    z, r = ctx.y0, ctx.r0
    q = torch.zeros_like(z)
    rq = None if r is None else torch.zeros_like(r)
    steps = times.shape[1]
    for i in range(steps):
        t = times[:, i]
        d, rd = predict(ctx.net, rows, z, q, t.float(), ctx.w, ctx.prompt_mask, r, rq, opt.prompt_cfg)
        ctx.observe(rows, i, t, z, d, r, rd)
        q, rq = d, rd
        if i == steps - 1:
            break
        t_next = times[:, i + 1]
        if opt.renoise_eta == 0:
            xi = torch.zeros_like(z)
            xr = None if r is None else torch.zeros_like(r)
        else:
            xi = ctx.noise.normal(rows, (length, dim))
            xr = None if r is None else ctx.noise.normal(rows, (r.shape[1],))
        z = with_clean_prompt(renoise_input(d, t_next, opt.renoise_eta, opt.sigma, xi), ctx.prompt_states,
                              ctx.prompt_mask)
        if r is not None:
            r = renoise_input(rd, t_next, opt.renoise_eta, opt.sigma, xr)
    return q, rq


def _finish(ctx: BatchContext, x: torch.Tensor, reg: torch.Tensor | None, exit_time: torch.Tensor,
            steps: int) -> SamplerOutput:
    rows = ctx.rows
    ids = ctx.net.decode(x, ctx.prompt_mask, reg, ctx.w, rows=rows)
    b = ctx.batch
    return SamplerOutput(token_ids=ids.cpu(), denoiser_calls=ctx.net.denoiser_calls.clone(),
                         decoder_calls=ctx.net.decoder_calls.clone(),
                         steps=torch.full((b,), steps, dtype=torch.long), exit_time=exit_time.cpu(),
                         early_exit=torch.zeros(b, dtype=torch.bool))


@torch.no_grad()
def run_sampler(net: Network | Student, prompt_states: torch.Tensor, prompt_mask: torch.Tensor, seeds: list[int],
                options: SamplingOptions, answer_key: CheckKey | None = None,
                record_every: int = 0) -> SamplerOutput:
    """Sample one batch: prompt states (B, L, d) with their mask (B, L), one seed per row.

    ``net`` is a :class:`Network` (a Student is wrapped in fp32 with a full argmax decode).

    ``answer_key`` is used by adaptive exit only; ``record_every`` > 0 records a
    :class:`~elfreg.sampling.trajectory.Trajectory` per row (every k-th step and the last).
    """
    ctx = make_context(as_network(net), prompt_states, prompt_mask, seeds, options, record_every)
    times = sampler_times(options, ctx.seeds)
    n = options.nfe
    if options.sampler == "adaptive":
        out = run_adaptive(ctx, times, answer_key)
    elif options.sampler == "full-span":
        y, r, _, _ = euler_path(ctx, times)
        out = _finish(ctx, y, r, times[:, -1], n - 1)
    elif options.sampler == "early-stop":
        _, _, d, rd = euler_path(ctx, times)
        out = _finish(ctx, d, rd, times[:, n - 2], n - 1)
    elif options.sampler == "renoise":
        d, rd = renoise_path(ctx, times)
        out = _finish(ctx, d, rd, times[:, -1], n - 1)
    else:  # SamplingOptions validates the name
        raise ValueError(f"unknown sampler {options.sampler!r}")
    if ctx.recorder is not None:
        ctx.recorder.final(ctx.rows, out.token_ids)
        info = [{"steps": int(out.steps[k]), "exit_time": float(out.exit_time[k]),
                 "early_exit": int(out.early_exit[k]), "nfe_budget": n} for k in range(ctx.batch)]
        out.trajectories = ctx.recorder.trajectories(options.sampler, ctx.seeds, out.nfe, info)
    return out
