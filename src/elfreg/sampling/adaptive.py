"""Adaptive exit (spec §8, beyond the paper): stop when the decoded answer stops changing.

The sampler follows the prefix early-stop trajectory of the budget N (Eq. 12 on the first points
of the M = ρ·N master grid, same grid and noise as early-stop for the same seed). After every K-th
denoiser step (``adaptive_interval``) it may *check*: decode the current clean prediction d_j
(one decoder call, counted as NFE) and compare its key — ``answer_key(text)``, e.g. the extracted
final number for math, the full text otherwise — with the key of the previous check. A check
whose key equals the previous check's extends the streak, any other resets it; when the streak
reaches ``patience`` the sample stops and returns that decode (no further call).

Budget rule (never more than N calls, checks included): one call is always kept for the final
decode, so a denoiser step is taken only if ``used + 2 ≤ N``. A check is made only if the exit it
could lead to is still affordable: the fewest checks that could end the run from here (patience −
streak, or patience + 1 before the first check), spaced K steps apart, must fit in the budget.
Otherwise the check would only spend budget, so it is skipped; once unaffordable a stop never
becomes affordable again, so no later check is made. Consequences: with patience larger than the
budget no check is ever made and the sampler is exactly early-stop (N − 1 steps, decode
D(d_{N−2})); a sample that does not stop finishes by decoding its last clean prediction
(reusing the decode of a check made on that same prediction, at no cost). Each sample reports the
calls it actually used.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from .context import BatchContext, CheckKey, SamplerOutput
from .updates import euler_update, predict, with_clean_prompt


def _default_key(_row: int, ids: torch.Tensor) -> Hashable:
    return tuple(ids[ids >= 0].tolist())


def checks_to_exit(streak: torch.Tensor, has_ref: torch.Tensor, patience: int) -> torch.Tensor:
    """The fewest further checks (this one included) that could end the run."""
    return torch.where(has_ref, patience - streak, torch.full_like(streak, patience + 1))


def exit_cost(step: int, interval: int, checks_made: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """Calls spent by the earliest possible exit when a check is due after denoiser step ``step``:
    denoiser steps up to the last needed check plus every check made by then."""
    return (step + (need - 1) * interval + 1) + checks_made + need


def run_adaptive(ctx: BatchContext, times: torch.Tensor, answer_key: CheckKey | None = None) -> SamplerOutput:
    """Adaptive exit over the early-stop prefix ``times`` (B, N) (see the module docstring)."""
    opt, dev = ctx.options, ctx.device
    key = answer_key or _default_key
    n, interval, patience = opt.nfe, opt.adaptive_interval, opt.adaptive_patience
    b, length = ctx.prompt_mask.shape
    times = times.to(dev)

    y, r = ctx.y0.clone(), None if ctx.r0 is None else ctx.r0.clone()
    q = torch.zeros_like(y)
    rq = None if r is None else torch.zeros_like(r)

    active = torch.ones(b, dtype=torch.bool)
    steps = torch.zeros(b, dtype=torch.long)
    checks = torch.zeros(b, dtype=torch.long)
    streak = torch.zeros(b, dtype=torch.long)
    has_ref = torch.zeros(b, dtype=torch.bool)
    checked_last = torch.zeros(b, dtype=torch.bool)  # the current d was decoded by a check
    early = torch.zeros(b, dtype=torch.bool)
    refs: list[Hashable | None] = [None] * b
    last_ids = torch.full((b, length), -1, dtype=torch.long)
    final_ids = torch.full((b, length), -1, dtype=torch.long)
    exit_time = torch.zeros(b, dtype=torch.float64)

    def finish(mask: torch.Tensor) -> None:
        """Final answer of the rows in ``mask``: their last clean prediction, decoded once."""
        reuse = mask & checked_last
        final_ids[reuse] = last_ids[reuse]
        todo = (mask & ~checked_last).nonzero().squeeze(1)
        if todo.numel():
            di = todo.to(dev)
            ids = ctx.net.decode(q[di], ctx.prompt_mask[di], None if rq is None else rq[di], ctx.w[di], rows=di)
            final_ids[todo] = ids.cpu()
        done = mask.nonzero().squeeze(1)
        exit_time[done] = times[done.to(dev), (steps[done] - 1).clamp(min=0).to(dev)].cpu()

    for j in range(n - 1):
        affordable = active & (ctx.net.nfe + 2 <= n)
        finish(active & ~affordable)
        active = affordable
        if not active.any():
            break
        idx = active.nonzero().squeeze(1)
        di = idx.to(dev)
        t, t_next = times[di, j], times[di, j + 1]
        yi, ri = y[di], None if r is None else r[di]
        d, rd = predict(ctx.net, di, yi, q[di], t.float(), ctx.w[di], ctx.prompt_mask[di], ri,
                        None if rq is None else rq[di], opt.prompt_cfg)
        ctx.observe(di, j, t, yi, d, ri, rd)
        y[di] = with_clean_prompt(euler_update(yi, d, t, t_next, opt.c_min), ctx.prompt_states[di],
                                  ctx.prompt_mask[di])
        q[di] = d
        if r is not None:
            r[di] = euler_update(ri, rd, t, t_next, opt.c_min)
            rq[di] = rd
        steps[idx] += 1
        checked_last[idx] = False

        if (j + 1) % interval:
            continue
        need = checks_to_exit(streak, has_ref, patience)
        due = active & (exit_cost(j, interval, checks, need) <= n)
        cidx = due.nonzero().squeeze(1)
        if not cidx.numel():
            continue
        ci = cidx.to(dev)
        ids = ctx.net.decode(q[ci], ctx.prompt_mask[ci], None if rq is None else rq[ci], ctx.w[ci], rows=ci).cpu()
        for k, row in enumerate(cidx.tolist()):
            k_new = key(row, ids[k])
            same = bool(has_ref[row]) and k_new == refs[row]
            streak[row] = streak[row] + 1 if same else 0
            refs[row], has_ref[row] = k_new, True
        checks[cidx] += 1
        checked_last[cidx] = True
        last_ids[cidx] = ids
        stop = due & (streak >= patience)
        if stop.any():
            early |= stop
            finish(stop)
            active &= ~stop
    finish(active)

    return SamplerOutput(token_ids=final_ids, denoiser_calls=ctx.net.denoiser_calls.clone(),
                         decoder_calls=ctx.net.decoder_calls.clone(), steps=steps, exit_time=exit_time,
                         early_exit=early)
