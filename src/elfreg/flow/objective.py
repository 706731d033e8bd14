"""The ELF-REG training objective for one batch: L = L_ELF + 0.5·L_REPA + 0.1·L_REG (ELF-REG §3, App. A).

Per batch row: one t ~ sigmoid(N(−1.5, 0.8)); with probability 0.2 a decode example (t = 1,
q = 0, the clean states perturbed at every position, the prompt's included, as in ELF's code;
token cross-entropy); otherwise a denoise example (the prompt clean, and clean in the
self-conditioning input too) whose self-conditioning bit b ~ Bernoulli(0.5) and guidance scale w
shape the target of Eq. 7–8.

The two auxiliary predictions of Eq. 8 run without gradient, only on the rows with b = 1, each
at its row's sampled w, as in ELF's training step. A student without SC-CFG tokens
(``model.cfg_tokens`` 0: w is not an input) learns the plain target, as ELF's training step
teaches it: only the no-sc prediction is made (the self-conditioning input of its rows). A run
without self-conditioning (``flow.sc_prob`` 0, a student built for it) calls the student on z
alone, bypassing ``self_cond_proj``, as ELF does. That choice is what makes the learned field a
guided one: at the fixed point f(sc, w) = c + (1 − 1/w)·(f(sc, w) − u), i.e.
f(sc, w) = u + w·(c − u) with u = f(0, w) the no-sc field and c the plain conditional target.
Auxiliary calls at w = 1 would instead give u + (2 − 1/w)·(c − u): w = 3 would act as 1.67 and no
w could reach 2 (tested in ``tests/test_flow.py``). The no-sc prediction is also the
self-conditioning input of the main pass for those rows, so a step costs at most two auxiliary
forwards plus the main one.

Normalisations (they differ on purpose):
- L_ELF: velocity error / d on denoise rows and cross-entropy on decode rows, one average over
  every supervised answer position of the batch (EOS padding included);
- L_REPA: 1 − cos averaged over answer content tokens plus the REG position of every row
  (decode rows included);
- L_REG: velocity error / d_r averaged over denoise rows only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ..config import FlowConfig, LossConfig
from ..model.student import Student
from ..text.canvas import Canvas
from ..text.frozen import TeacherTargets
from .losses import masked_mean, repa_cosine, token_cross_entropy, velocity_sq_error
from .noising import (
    RowDraws,
    add_noise,
    perturb_for_decoding,
    rand,
    randn,
    sample_guidance_scale,
    sample_logit_normal,
    velocity,
)
from .targets import sc_cfg_target


@dataclass
class TrainBatch:
    canvas: Canvas
    x: torch.Tensor  # (B, L, d) clean standardised encoder states of prompt + answer
    teacher: TeacherTargets | None = None


@dataclass
class LossTerms:
    total: torch.Tensor
    elf: torch.Tensor
    denoise: torch.Tensor  # velocity part of L_ELF alone (for logging)
    decode: torch.Tensor  # cross-entropy part of L_ELF alone (for logging)
    repa: torch.Tensor
    reg: torch.Tensor

    def as_floats(self) -> dict[str, float]:
        return {k: float(v.detach()) for k, v in self.__dict__.items()}


def _randn_like(x: torch.Tensor, source: torch.Generator | RowDraws) -> torch.Tensor:
    return randn(x.shape, source).to(x.device)


def _rand(n: int, source: torch.Generator | RowDraws, device: torch.device) -> torch.Tensor:
    return rand((n,), source).to(device)


CountReduce = Callable[[torch.Tensor], torch.Tensor]
"""Sums a vector of averaging-set sizes over the ranks that share a global batch (identity on
one process)."""


def decode_cross_entropy(student: Student, hidden: torch.Tensor, tokens: torch.Tensor,
                         chunk: int = 8192, always: bool = False) -> torch.Tensor:
    """Per-position CE of the decoder head on (N, H) states, in chunks so that N×V logits never
    sit in memory at once (the Qwen3 vocabulary has 151,936 entries). ``always`` runs the head
    even on no states, so its weights get a (zero) gradient on a rank without decode rows when
    other ranks have some, as the ranks' gradient reductions require."""
    def ce(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return token_cross_entropy(student.decode_logits(h), y)

    parts = []
    if always and hidden.shape[0] == 0:
        parts.append(ce(hidden, tokens))
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start:start + chunk], tokens[start:start + chunk]
        parts.append(checkpoint(ce, h, y, use_reentrant=False) if torch.is_grad_enabled() else ce(h, y))
    return torch.cat(parts) if parts else hidden.new_zeros(0)


def elf_term(vel_err: torch.Tensor, decode_ce: torch.Tensor, answer: torch.Tensor,
             decode: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """L_ELF: velocity error / d on denoise rows plus the decoder CE of decode rows (``decode_ce``
    holds the values at ``answer & decode`` positions, in order), averaged over all supervised
    answer positions of the batch, EOS padding included (``count``: their number over the whole
    global batch when this is one rank's share of it)."""
    denoise_pos = answer & ~decode[:, None]
    count = answer.sum() if count is None else count
    return ((vel_err * denoise_pos).sum() + decode_ce.sum()) / count.clamp(min=1)


def repa_mask(content_mask: torch.Tensor, with_reg: bool) -> torch.Tensor:
    """The positions L_REPA averages over: answer content tokens, plus the REG position of every
    row (last column) with REG."""
    if not with_reg:
        return content_mask
    return torch.cat([content_mask, torch.ones_like(content_mask[:, :1])], dim=1)


def repa_term(pred: torch.Tensor, teacher: TeacherTargets, content_mask: torch.Tensor,
              with_reg: bool, count: torch.Tensor | None = None) -> torch.Tensor:
    """L_REPA: 1 − cos averaged over answer content tokens plus, with REG, the REG position of
    every row; prompt, padding and special tokens carry no weight. ``pred`` holds the
    projections at exactly those positions (:func:`repa_mask`), (N, D) in row-major order, as
    the student returns them when asked for ``repa_positions``."""
    target = teacher.repa
    if with_reg:
        target = torch.cat([target, teacher.reg_repa[:, None]], dim=1)
    mask = repa_mask(content_mask, with_reg)
    if pred.shape[0] != int(mask.sum()):
        raise ValueError(f"{pred.shape[0]} REPA projections for {int(mask.sum())} supervised positions")
    return repa_cosine(pred, target[mask]).sum() / (mask.sum() if count is None else count).clamp(min=1)


def reg_term(reg_err: torch.Tensor, decode: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """L_REG: per-row velocity error / d_r averaged over denoise rows only."""
    return masked_mean(reg_err, ~decode, count)


def elf_reg_loss(student: Student, batch: TrainBatch, flow: FlowConfig, loss: LossConfig,
                 generator: torch.Generator | RowDraws, reduce_counts: CountReduce | None = None) -> LossTerms:
    """All loss terms for one batch. Randomness comes only from ``generator``: one generator for
    the batch, or :class:`~elfreg.flow.noising.RowDraws` (one per row; what training uses). The
    student's shape says which terms there are (``model.repa``, ``model.extra_token``), ``loss``
    their weights.

    ``reduce_counts`` makes this batch one rank's share of a global batch: every term is then
    (this share's sum) / (the size of the term's averaging set over the global batch), so the
    terms summed over ranks are the global batch's terms, exactly those one process computes.
    """
    canvas, x = batch.canvas, batch.x.float()
    bsz, dev = x.shape[0], x.device
    prompt = canvas.prompt_mask
    use_reg, use_repa = student.cfg.extra_token == "reg", student.cfg.repa
    if (use_repa or use_reg) and batch.teacher is None:
        raise ValueError("REPA/REG are on but the batch has no teacher targets")
    if flow.sc_prob > 0 and not student.self_conditioning:
        raise ValueError("flow.sc_prob > 0, but the student was built without self-conditioning (flow.sc_prob 0)")
    guided = student.cfg.cfg_tokens > 0  # the SC-CFG target needs w as an input

    t = sample_logit_normal((bsz,), flow.t_logit_mean, flow.t_logit_std, generator).to(dev)
    decode = _rand(bsz, generator, dev) < flow.decode_prob
    b = (_rand(bsz, generator, dev) < flow.sc_prob) & ~decode
    w = sample_guidance_scale(bsz, flow.w_min, flow.w_max, generator).to(dev)
    lam = sample_logit_normal(x.shape[:2], flow.decode_lambda_mean, flow.decode_lambda_std, generator).to(dev)

    # denoise rows: Eq. 1 with the prompt kept clean; decode rows: the perturbed clean states at
    # every position, the prompt's included (ELF's decoder input), at t = 1
    z = torch.where(prompt[..., None], x, add_noise(x, t, flow.sigma, _randn_like(x, generator)))
    z = torch.where(decode[:, None, None], perturb_for_decoding(x, lam, flow.decode_noise_scale,
                                                                _randn_like(x, generator)), z)
    t_in = torch.where(decode, torch.ones_like(t), t)

    r = r_in = None
    if use_reg:
        r = batch.teacher.reg.float()
        r_in = add_noise(r, t, flow.sigma, _randn_like(r, generator))
        r_dec = perturb_for_decoding(r, lam[:, 0], flow.decode_noise_scale, _randn_like(r, generator))
        r_in = torch.where(decode[:, None], r_dec, r_in)

    answer = canvas.answer_mask
    decode_pos = answer & decode[:, None]
    denoise_pos = answer & ~decode[:, None]
    # averaging-set sizes over the global batch, before any forward (every rank calls collectives
    # in the same order); the last one says whether any rank has a row with b = 1
    # the projector runs only where L_REPA reads it: the same loss, and on the toy canvases (short
    # answers) about a third of the projector's work (docs/performance.md)
    repa_at = repa_mask(canvas.content_mask, use_reg)
    n_answer, n_denoise, n_decode, n_repa, n_reg, n_aux = averaging_counts(
        [answer, denoise_pos, decode_pos, repa_at, ~decode, b], reduce_counts)

    # Auxiliary predictions of Eq. 8 (no gradient, rows with b = 1, at each row's own w). When
    # another rank has such rows and this one none, the passes run on no rows: sharded weights
    # are gathered by every rank together. The self-conditioning input holds the clean prompt at
    # prompt positions on denoise rows (ELF's restore_cond) and is zero on decode rows.
    sc = torch.where(prompt[..., None] & ~decode[:, None, None], x, torch.zeros_like(x))
    reg_sc = torch.zeros_like(r) if use_reg else None
    v_sc = v_nosc = torch.zeros_like(x)
    rv_sc = rv_nosc = torch.zeros_like(r) if use_reg else None
    rows = b.nonzero().squeeze(1)
    if n_aux > 0:
        with torch.no_grad():
            zr, tr, wr, pr = z[rows], t[rows], w[rows], prompt[rows]
            rr = r_in[rows] if use_reg else None
            nosc = student(zr, sc[rows], tr, wr, pr, reg=rr)
            sc = sc.index_copy(0, rows, nosc.x_hat.float())
            if use_reg:
                reg_sc = reg_sc.index_copy(0, rows, nosc.reg_hat)
            if guided:
                with_sc = student(zr, nosc.x_hat, tr, wr, pr, reg=rr, reg_self_cond=nosc.reg_hat)
                v_nosc = v_nosc.index_copy(0, rows, velocity(nosc.x_hat.float(), zr, tr, flow.c_min))
                v_sc = v_sc.index_copy(0, rows, velocity(with_sc.x_hat.float(), zr, tr, flow.c_min))
                if use_reg:
                    rv_nosc = rv_nosc.index_copy(0, rows, velocity(nosc.reg_hat, rr, tr, flow.c_min))
                    rv_sc = rv_sc.index_copy(0, rows, velocity(with_sc.reg_hat, rr, tr, flow.c_min))

    out = student(z, sc if student.self_conditioning else None, t_in, w, prompt, decode=decode, reg=r_in,
                  reg_self_cond=reg_sc, want_repa=use_repa, repa_positions=repa_at if use_repa else None)

    b_guide = b & guided  # rows whose target carries the guidance term of Eq. 8
    v_target = sc_cfg_target(x, z, t, b_guide, w, v_sc, v_nosc, flow.c_min)
    per_pos = velocity_sq_error(out.x_hat, z, t, v_target, flow.c_min)
    ce = decode_cross_entropy(student, out.hidden[decode_pos], canvas.tokens[decode_pos], always=bool(n_decode > 0))
    elf = elf_term(per_pos, ce, answer, decode, n_answer)
    zero = x.new_zeros(())

    repa = zero
    if use_repa:
        repa = repa_term(out.repa, batch.teacher, canvas.content_mask, use_reg, n_repa)

    reg = zero
    if use_reg:
        rv_target = sc_cfg_target(r, r_in, t, b_guide, w, rv_sc, rv_nosc, flow.c_min)
        reg = reg_term(velocity_sq_error(out.reg_hat, r_in, t, rv_target, flow.c_min), decode, n_reg)

    total = elf + loss.repa_weight * repa + loss.reg_weight * reg
    return LossTerms(
        total=total, elf=elf,
        denoise=masked_mean(per_pos, denoise_pos, n_denoise).detach(),
        decode=(ce.sum() / n_decode.clamp(min=1)).detach(),
        repa=repa, reg=reg,
    )


def averaging_counts(masks: list[torch.Tensor], reduce_counts: CountReduce | None) -> list[torch.Tensor]:
    """The size of each averaging set (float), summed over ranks by ``reduce_counts``."""
    counts = torch.stack([m.sum() for m in masks]).float()
    return list((reduce_counts(counts) if reduce_counts is not None else counts).unbind())
