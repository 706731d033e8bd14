"""The progressive-distillation objective of one batch (ELF's ``distill_train_step``; the
equations are :mod:`elfreg.flow.distill`'s, docs/distillation.md).

Each row is a decode row (with probability ``flow.decode_prob``: the decoder's cross-entropy at
t = 1 on the perturbed clean states, as in training) or a distillation row: its state at t_s,
optionally self-conditioned (probability ``flow.sc_prob``) on the teacher's own prediction there
with zero self-conditioning, is carried by the frozen teacher over the student's span in K Euler
steps — elfreg's full-span sampling loop (:func:`~elfreg.sampling.samplers.follow_path`) on the
sub-step grid, the same update, prompt restoration and self-conditioning chain as sampling — and
the student regresses, from the same input, onto the prediction whose one step lands where the
teacher's K did. For a REG student the REG token runs with the text through the teacher's steps,
and its target is the teacher's K-step REG update. The SC-CFG scale w is drawn per row as in
training and given to teacher and student alike: the distilled student keeps w as an input, and
each of its steps reproduces K of the teacher's at that w. A student without SC-CFG tokens is
distilled from its teacher's unguided steps (w = 1, as ELF's step, which does not guide such a
teacher by calls).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import FlowConfig, LossConfig, SampleConfig
from ..flow.distill import (
    DistillDraws,
    distill_terms,
    implied_prediction,
    prediction_sq_error,
    student_span,
    substep_times,
)
from ..flow.noising import add_noise, perturb_for_decoding
from ..flow.objective import CountReduce, LossTerms, TrainBatch, averaging_counts, decode_cross_entropy
from ..model.student import Student
from ..sampling.network import CountingNetwork, Network
from ..sampling.samplers import BatchContext, SamplerState, euler_move, follow_path
from ..sampling.steps import predict


@dataclass
class DistillTargets:
    """What the teacher gives the distillation rows: the targets x* (B, L, d) and r* (B, d_r), the
    self-conditioning input the student shares with the teacher's first step (q, r_q), and the
    teacher's calls per row."""

    x: torch.Tensor
    reg: torch.Tensor | None
    q: torch.Tensor
    reg_q: torch.Tensor | None
    calls: torch.Tensor


@torch.no_grad()
def teacher_targets(teacher: Network, x: torch.Tensor, prompt: torch.Tensor, z: torch.Tensor, r: torch.Tensor | None,
                    times: torch.Tensor, w: torch.Tensor, self_cond: torch.Tensor, flow: FlowConfig
                    ) -> DistillTargets:
    """The targets of rows at (z, r) = (z_{t_s}, r_{t_s}) over ``times`` (B, K + 1), τ_0 = t_s to
    τ_K = t_t: the first step self-conditioned on the teacher's prediction at τ_0 with zero
    self-conditioning on the ``self_cond`` rows (zero self-conditioning on the others), each later
    one on the previous step's prediction; prompt positions hold the clean states ``x``."""
    b = z.shape[0]
    net = CountingNetwork(teacher, b)
    q = torch.where(prompt[..., None], x, torch.zeros_like(x))
    rq = None if r is None else torch.zeros_like(r)
    rows = self_cond.nonzero().squeeze(1)
    if rows.numel():
        d, rd = predict(net, rows, z[rows], q[rows], times[rows, 0].float(), w[rows], prompt[rows],
                        None if r is None else r[rows], None if rq is None else rq[rows])
        q[rows] = d
        if rq is not None:
            rq[rows] = rd
    steps = times.shape[1] - 1
    ctx = BatchContext(net, SampleConfig(sampler="full-span", nfe=steps + 1), flow, x, prompt, None, w, None)
    path = SamplerState(z.clone(), None if r is None else r.clone(), q.clone(), None if rq is None else rq.clone(),
                        torch.zeros(b, dtype=torch.long))
    follow_path(ctx, path, times, euler_move)
    t_s, t_t = times[:, 0], times[:, -1]
    x_star = implied_prediction(z, path.y, t_s, t_t, flow.c_min)
    r_star = None if r is None else implied_prediction(r, path.r, t_s, t_t, flow.c_min)
    return DistillTargets(x_star, r_star, q, rq, net.denoiser_calls.clone())


def distill_loss(student: Student, teacher: Network, batch: TrainBatch, flow: FlowConfig, loss: LossConfig,
                 span: float, draws: DistillDraws, reduce_counts: CountReduce | None = None) -> LossTerms:
    """The distillation loss of one batch for student steps of ``span`` h (see the module
    docstring), from the batch's ``draws`` (:func:`~elfreg.flow.distill.draw_distill`). Terms:
    ``total`` the mean over rows of each row's loss; ``denoise`` the mean ‖x̂ − x*‖²/d of the
    distillation rows, ``decode`` the mean cross-entropy of the decode rows, ``reg`` the mean
    ‖r̂ − r*‖²/d_r of the distillation rows, ``elf`` the text part of ``total`` (``repa`` 0: REPA
    is not a distillation term). ``reduce_counts`` makes this batch one rank's share of a global
    batch (as :func:`~elfreg.flow.objective.elf_reg_loss`)."""
    canvas, x = batch.canvas, batch.x.float()
    b, dev = x.shape[0], x.device
    prompt, answer = canvas.prompt_mask, canvas.answer_mask
    use_reg = student.cfg.extra_token == "reg"
    if use_reg and batch.teacher is None:
        raise ValueError("a REG student is distilled with the REG targets of its frozen teacher LM")
    if flow.sc_prob > 0 and not student.self_conditioning:
        raise ValueError("flow.sc_prob > 0, but the student was built without self-conditioning (flow.sc_prob 0)")
    decode, distilled = draws.decode.to(dev), ~draws.decode.to(dev)
    t_s, _ = student_span(draws.u.to(dev), span)
    w = draws.w.to(dev) if student.cfg.cfg_tokens > 0 else torch.ones(b, device=dev)

    z = torch.where(prompt[..., None], x, add_noise(x, t_s, flow.sigma, draws.noise.to(dev)))
    z_dec = perturb_for_decoding(x, draws.lam.to(dev), flow.decode_noise_scale, draws.decode_noise.to(dev))
    r = r_s = r_dec = None
    if use_reg:
        r = batch.teacher.reg.float()
        r_s = add_noise(r, t_s, flow.sigma, draws.reg_noise.to(dev))
        r_dec = perturb_for_decoding(r, draws.lam[:, 0].to(dev), flow.decode_noise_scale,
                                     draws.reg_decode_noise.to(dev))
    n_rows, n_distilled, n_decode = averaging_counts([torch.ones_like(decode), distilled, decode], reduce_counts)

    # the teacher's targets of the distillation rows; decode rows keep zeros (no target, no
    # self-conditioning: the decoder is trained and called without it)
    x_star, q = torch.zeros_like(x), torch.where(prompt[..., None] & distilled[:, None, None], x, torch.zeros_like(x))
    r_star, rq = (None, None) if r is None else (torch.zeros_like(r), torch.zeros_like(r))
    rows = distilled.nonzero().squeeze(1)
    if rows.numel():
        times = substep_times(t_s[rows], span, draws.inner.to(dev)[rows])
        got = teacher_targets(teacher, x[rows], prompt[rows], z[rows], None if r is None else r_s[rows], times,
                              w[rows], draws.self_cond.to(dev)[rows], flow)
        x_star[rows], q[rows] = got.x, got.q
        if use_reg:
            r_star[rows], rq[rows] = got.reg, got.reg_q

    where = decode[:, None, None]
    out = student(torch.where(where, z_dec, z), q if student.self_conditioning else None,
                  torch.where(decode, torch.ones_like(t_s), t_s), w, prompt, decode=decode,
                  reg=None if r is None else torch.where(decode[:, None], r_dec, r_s), reg_self_cond=rq)
    decode_pos = answer & decode[:, None]
    ce = decode_cross_entropy(student, out.hidden[decode_pos], canvas.tokens[decode_pos], always=bool(n_decode > 0))
    ce = torch.zeros(answer.shape, device=dev, dtype=ce.dtype).masked_scatter(decode_pos, ce)
    reg_error = prediction_sq_error(out.reg_hat, r_star) if use_reg else None
    return distill_terms(out.x_hat, x_star, ce, answer, decode, reg_error, loss.reg_weight,
                         (n_rows, n_distilled, n_decode))
