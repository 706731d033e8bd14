"""Policies that decode the clean prediction mid-path and act on what they read (beyond the paper, beyond
the paper): :class:`AdaptiveExit` stops a sample whose answer has stopped changing;
:class:`CanvasTrim` stops computing the canvas positions past an answer whose end has stopped
moving. Both spend counted decoder calls on their checks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

import torch

from ..config import SampleConfig
from .network import CountingNetwork

if TYPE_CHECKING:
    from .samplers import SamplerState

# (sample index in the batch, (L,) argmax ids of a decode) → the key compared by adaptive exit.
CheckKey = Callable[[int, torch.Tensor], Hashable]


def _whole_answer(_row: int, ids: torch.Tensor) -> Hashable:
    return tuple(ids[ids >= 0].tolist())


def decode_prediction(net: CountingNetwork, path: SamplerState, rows: torch.Tensor, prompt_mask: torch.Tensor,
                      w: torch.Tensor) -> torch.Tensor:
    """One counted decoder call on the current clean prediction of ``rows`` (whole canvas), on the CPU."""
    di = rows.to(prompt_mask.device)
    reg = None if path.rq is None else path.rq[di]
    return net.decode(path.q[di], prompt_mask[di], reg, w[di], rows=di).cpu()


def checks_to_exit(streak: torch.Tensor, has_ref: torch.Tensor, patience: int) -> torch.Tensor:
    """The fewest further checks (this one included) that could complete a streak of ``patience``."""
    return torch.where(has_ref, patience - streak, torch.full_like(streak, patience + 1))


def exit_cost(step: int, interval: int, checks_made: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """Calls spent by the earliest possible exit when a check is due after denoiser step ``step``:
    denoiser steps up to the last needed check plus every check made by then."""
    return (step + (need - 1) * interval + 1) + checks_made + need


class AdaptiveExit:
    """Adaptive exit (beyond the paper): stop a sample when its decoded answer stops changing.

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

    def _retire(self, path: SamplerState, mask: torch.Tensor) -> None:
        """Final answer of the rows in ``mask``: their last clean prediction, decoded once."""
        reuse = mask & self.checked_last
        self.final_ids[reuse] = self.last_ids[reuse]
        todo = (mask & ~self.checked_last).nonzero().squeeze(1)
        if todo.numel():
            self.final_ids[todo] = decode_prediction(self.net, path, todo, self.prompt_mask, self.w)
        done = mask.nonzero().squeeze(1)
        at = (path.steps[done] - 1).clamp(min=0)
        self.exit_time[done] = self.times[done.to(self.times.device), at.to(self.times.device)].cpu()
        self.active &= ~mask

    def before_step(self, path: SamplerState, active: torch.Tensor) -> torch.Tensor:
        affordable = active & (self.net.nfe + 2 <= self.n)
        self._retire(path, active & ~affordable)
        return self.active.clone()

    def after_step(self, j: int, path: SamplerState, active: torch.Tensor) -> torch.Tensor:
        self.checked_last[active] = False
        if (j + 1) % self.interval:
            return self.active.clone()
        need = checks_to_exit(self.streak, self.has_ref, self.patience)
        due = active & (exit_cost(j, self.interval, self.checks, need) <= self.n)
        rows = due.nonzero().squeeze(1)
        if rows.numel():
            ids = decode_prediction(self.net, path, rows, self.prompt_mask, self.w)
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

    def finish(self, path: SamplerState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Retire the rows still running; (token ids, exit times, early-exit flags)."""
        self._retire(path, self.active.clone())
        return self.final_ids, self.exit_time, self.early


# Trimmed canvas lengths are rounded up to a multiple of this many positions, so that the rows of a
# batch share few lengths (one network call per distinct length and step) and a compiled network
# meets few shapes.
TRIM_BUCKET = 8


def answer_end(ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B,) one past the first EOS of each decoded row of ``ids`` (B, L): the canvas length the
    row's answer needs, prompt included; L where a row has no EOS."""
    is_eos = ids == eos_id
    first = is_eos.long().argmax(1)
    return torch.where(is_eos.any(1), first + 1, torch.full_like(first, ids.shape[1]))


def trimmed_length(end: torch.Tensor, margin: int, length: int) -> torch.Tensor:
    """Canvas kept for answers ending at ``end``: ``margin`` positions more, rounded up to a
    multiple of :data:`TRIM_BUCKET`, at most the whole canvas ``length``."""
    return (-(-(end + margin) // TRIM_BUCKET) * TRIM_BUCKET).clamp(max=length)


class CanvasTrim:
    """Canvas trimming: stop computing canvas positions past a settled answer.

    After every K-th denoiser step (``trim_interval``) an untrimmed row may *check*: decode its
    current clean prediction d_j (one decoder call, counted as NFE on top of the sampler's N) and
    read where its answer ends (one past its first EOS). A check whose end equals the previous
    check's extends the streak, any other resets it; at a streak of ``trim_patience`` the row is
    trimmed for the rest of its path: every later call, the final decode included, runs on canvas
    positions [0, n) only, n = that end + ``trim_margin`` rounded up to a multiple of
    :data:`TRIM_BUCKET` (at most L), and the decoded positions from n on are EOS. A row is trimmed
    once and checks no more; a check is made only if the trim it could lead to leaves at least one
    denoiser call to run on the shorter canvas.

    Trimming can change the answer: the network attends over the whole canvas, so dropping the
    EOS positions past n changes its predictions before n (training always saw the whole canvas;
    the margin keeps an EOS region in view), and an answer that grows past n after the trim is cut
    at n. A row's length depends on its own decodes only, so a sample's answer does not depend on
    the batch it runs in.
    """

    def __init__(self, net: CountingNetwork, sample: SampleConfig, prompt_mask: torch.Tensor, w: torch.Tensor,
                 eos_id: int):
        self.net, self.prompt_mask, self.w, self.eos = net, prompt_mask, w, eos_id
        self.interval, self.patience, self.margin = sample.trim_interval, sample.trim_patience, sample.trim_margin
        self.n_steps = sample.nfe - 1  # denoiser steps of every sampler's path
        b, self.length = prompt_mask.shape
        self.lengths = torch.full((b,), self.length, dtype=torch.long)
        self.trimmed = torch.zeros(b, dtype=torch.bool)
        self.streak = torch.zeros(b, dtype=torch.long)
        self.has_ref = torch.zeros(b, dtype=torch.bool)
        self.ref_end = torch.zeros(b, dtype=torch.long)

    def groups(self, rows: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        """``rows`` (sample indices, CPU) split by canvas length: (rows, n) pairs, shortest first."""
        n = self.lengths[rows]
        return [(rows[n == k], k) for k in n.unique().tolist()]

    def after_step(self, j: int, path: SamplerState, active: torch.Tensor) -> None:
        if (j + 1) % self.interval:
            return
        need = checks_to_exit(self.streak, self.has_ref, self.patience)
        trimming_check = j + (need - 1) * self.interval  # the step after which the streak could complete
        rows = (active & ~self.trimmed & (trimming_check + 1 < self.n_steps)).nonzero().squeeze(1)
        if not rows.numel():
            return
        end = answer_end(decode_prediction(self.net, path, rows, self.prompt_mask, self.w), self.eos)
        same = self.has_ref[rows] & (end == self.ref_end[rows])
        self.streak[rows] = torch.where(same, self.streak[rows] + 1, 0)
        self.ref_end[rows], self.has_ref[rows] = end, True
        settled = rows[self.streak[rows] >= self.patience]
        self.lengths[settled] = trimmed_length(self.ref_end[settled], self.margin, self.length)
        self.trimmed[settled] = True
