"""Progressive distillation's equations (ELF's ``distillation`` branch; docs/distillation.md).

An N-step student takes steps of span h = 1/N. A distillation example draws the start of a
student step, t_s = u·max(1 − h, 10⁻⁶) with u from the schedule, so its end t_t = t_s + h stays
≤ 1, and noises its clean states to z_{t_s} (Eq. 1; the prompt kept clean) and, for a REG
student, r_{t_s} (the REG state with its own noise). The frozen teacher takes K Euler steps
(Eq. 12) of the joint text + REG state over t_s = τ_0 < τ_1 < … < τ_K = t_t, its inner times
sorted draws of the schedule scaled into the span, each step self-conditioned on the teacher's
previous prediction, and ends at (z_{t_t}, r_{t_t}). The student's target is the clean
prediction whose one Euler step from t_s lands there (:func:`implied_prediction`):

    x* = z_{t_s} + c_{t_s}·(z_{t_t} − z_{t_s}) / h,    c_t = max(1 − t, c_min),

and r* the same of the REG state: REG is denoised jointly with the text, so its target is the
teacher's K-step REG update too. The loss of a row is ‖x̂ − x*‖²/d averaged over its answer
positions (and, for REG, ``loss.reg_weight``·‖r̂ − r*‖²/d_r), or the decoder's cross-entropy on a
decode row; the batch's loss is the mean over its rows (ELF's per-example mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import FlowConfig
from .noising import RowDraws, c_t, rand, randn, sample_guidance_scale, sample_logit_normal
from .objective import LossTerms

# ELF's floor on 1 − h, so that a one-step student's t_s stays a number times u
SPAN_FLOOR = 1e-6


def draw_schedule(shape: tuple[int, ...], schedule: str, flow: FlowConfig,
                  source: torch.Generator | RowDraws) -> torch.Tensor:
    """Draws in [0, 1] of the distillation's time ``schedule``: ``logit-normal`` is training's
    sigmoid(N(t_logit_mean, t_logit_std)), ``uniform`` is U[0, 1)."""
    if schedule == "logit-normal":
        return sample_logit_normal(shape, flow.t_logit_mean, flow.t_logit_std, source)
    if schedule == "uniform":
        return rand(shape, source)
    raise ValueError(f"unknown distillation schedule {schedule!r} (logit-normal or uniform)")


def student_span(u: torch.Tensor, span: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_s, t_t) of student steps of span h: t_s = u·max(1 − h, 10⁻⁶), t_t = t_s + h."""
    t_s = u * max(1.0 - span, SPAN_FLOOR)
    return t_s, t_s + span


def substep_times(t_s: torch.Tensor, span: float, inner: torch.Tensor) -> torch.Tensor:
    """The teacher's grid (B, K + 1) over one student step: t_s, t_s + h·u_(1) … t_s + h·u_(K−1),
    t_s + h, with ``inner`` (B, K − 1) the unsorted draws u in [0, 1]."""
    inside = t_s[:, None] + span * inner.sort(dim=1).values.to(t_s.dtype)
    return torch.cat([t_s[:, None], inside, (t_s + span)[:, None]], dim=1)


def implied_prediction(z_start: torch.Tensor, z_end: torch.Tensor, t_start: torch.Tensor, t_end: torch.Tensor,
                       c_min: float = 0.05) -> torch.Tensor:
    """x* = z_{t_s} + c_{t_s}·(z_{t_t} − z_{t_s})/(t_t − t_s): the clean prediction whose one Euler
    step (Eq. 12) from t_s to t_t reaches ``z_end`` (the progressive-distillation target of
    Salimans & Ho, in flow matching's x-prediction form). Times are per row (B,)."""
    shape = (-1, *([1] * (z_start.dim() - 1)))
    c = c_t(t_start.to(z_start.dtype), c_min).reshape(shape)
    return z_start + c * (z_end - z_start) / (t_end - t_start).to(z_start.dtype).reshape(shape)


def prediction_sq_error(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """‖pred − target‖²/d over the last axis (fp32): the distillation's regression in x-form."""
    return (pred.float() - target.float()).pow(2).mean(-1)


def row_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) the mean of each row of ``values`` (B, L) over its ``mask`` positions (0 for none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(1) / mask.sum(1).clamp(min=1)


def distill_terms(x_hat: torch.Tensor, x_star: torch.Tensor, ce: torch.Tensor, answer: torch.Tensor,
                  decode: torch.Tensor, reg_error: torch.Tensor | None, reg_weight: float,
                  counts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> LossTerms:
    """The loss of a batch from its student's predictions: a distillation row's loss is the mean
    of ‖x̂ − x*‖²/d over its ``answer`` positions plus ``reg_weight``·‖r̂ − r*‖²/d_r (``reg_error``,
    (B,)), a decode row's the mean of its cross-entropy ``ce`` (B, L) over them; ``total`` is the
    mean over rows, ``denoise``, ``decode`` and ``reg`` each term's mean over its rows, ``elf``
    the text part of ``total``. ``counts``: the (rows, distillation rows, decode rows) of the
    global batch when this batch is one rank's share of it."""
    distilled = ~decode
    if counts is None:
        counts = tuple(m.sum().float() for m in (torch.ones_like(decode), distilled, decode))
    n_rows, n_distilled, n_decode = counts
    text = torch.where(decode, row_means(ce, answer), row_means(prediction_sq_error(x_hat, x_star), answer))
    reg = torch.zeros_like(text) if reg_error is None else reg_error * distilled
    return LossTerms(total=(text + reg_weight * reg).sum() / n_rows, elf=text.sum() / n_rows,
                     denoise=((text * distilled).sum() / n_distilled.clamp(min=1)).detach(),
                     decode=((text * decode).sum() / n_decode.clamp(min=1)).detach(),
                     repa=text.new_zeros(()), reg=reg.sum() / n_distilled.clamp(min=1))


@dataclass
class DistillDraws:
    """Every random draw of one distillation batch, per row (:func:`draw_distill`)."""

    u: torch.Tensor  # (B,) the student step's start before scaling (t_s = u·(1 − h))
    decode: torch.Tensor  # (B,) bool: a decode row (the decoder's cross-entropy at t = 1)
    self_cond: torch.Tensor  # (B,) bool: the step starts self-conditioned on the teacher's prediction
    w: torch.Tensor  # (B,) SC-CFG scale, 1 + w log-uniform
    lam: torch.Tensor  # (B, L) a decode row's per-token mixing weight λ
    noise: torch.Tensor  # (B, L, d) ε of z_{t_s}
    decode_noise: torch.Tensor  # (B, L, d) ε of a decode row's input
    reg_noise: torch.Tensor | None  # (B, d_r) ε of r_{t_s}
    reg_decode_noise: torch.Tensor | None  # (B, d_r) ε of a decode row's REG input
    inner: torch.Tensor  # (B, K − 1) the teacher's inner times before sorting and scaling


def draw_distill(shape: tuple[int, int, int], reg_dim: int | None, teacher_steps: int, flow: FlowConfig,
                 student_schedule: str, teacher_schedule: str, source: torch.Generator | RowDraws) -> DistillDraws:
    """The draws of a batch of states ``shape`` (B, L, d), in this order per row (a row's draws
    are a function of its generator alone): u, the decode coin, the self-conditioning coin, w, λ,
    the text noises, the REG noises, the inner times."""
    b, length, _ = shape
    u = draw_schedule((b,), student_schedule, flow, source)
    decode = rand((b,), source) < flow.decode_prob
    self_cond = rand((b,), source) < flow.sc_prob
    w = sample_guidance_scale(b, flow.w_min, flow.w_max, source)
    lam = sample_logit_normal((b, length), flow.decode_lambda_mean, flow.decode_lambda_std, source)
    noise, decode_noise = randn(shape, source), randn(shape, source)
    reg_noise = reg_decode_noise = None
    if reg_dim:
        reg_noise, reg_decode_noise = randn((b, reg_dim), source), randn((b, reg_dim), source)
    inner = draw_schedule((b, teacher_steps - 1), teacher_schedule, flow, source)
    return DistillDraws(u, decode, self_cond, w, lam, noise, decode_noise, reg_noise, reg_decode_noise, inner)
