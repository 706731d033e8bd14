"""The distillation objective of one batch (elfreg.train.distill_objective): the teacher's targets
through elfreg's sampling loop against a hand computation with an analytic teacher (the REG
token's target included), and the whole loss against its pieces."""

from __future__ import annotations

import pytest
import torch

from elfreg.config import FlowConfig, LossConfig, ModelConfig
from elfreg.flow.distill import (
    distill_terms,
    draw_distill,
    implied_prediction,
    prediction_sq_error,
    student_span,
    substep_times,
)
from elfreg.flow.noising import add_noise, c_t, perturb_for_decoding
from elfreg.flow.objective import TrainBatch
from elfreg.model.student import Student
from elfreg.text.canvas import Canvas
from elfreg.text.frozen import TeacherTargets
from elfreg.train.distill_objective import distill_loss, teacher_targets


class LinearTeacher:
    """x̂ = a·z + b·q + w·e (prompt positions keep z), r̂ = α·r + β·r_q: a field whose Euler steps
    can be followed by hand, self-conditioning and the SC-CFG scale w included; every call logged."""

    def __init__(self, reg_dim: int | None, a=0.7, b=0.2, alpha=0.5, beta=-0.3, e=0.05):
        self.reg_dim, self.a, self.b, self.alpha, self.beta, self.e = reg_dim, a, b, alpha, beta, e
        self.calls: list[dict[str, torch.Tensor]] = []

    def predict(self, z, q, w, prompt, r, rq):
        x = torch.where(prompt[..., None], z, self.a * z + self.b * q + self.e * w[:, None, None])
        return x, None if r is None else self.alpha * r + self.beta * rq

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.calls.append({"t": t.clone(), "w": w.clone(), "rows": z.shape[0]})
        return self.predict(z, q, w, prompt_mask, reg, reg_q)

    def decode(self, x, prompt_mask, reg, w):
        raise AssertionError("the teacher never decodes")


@pytest.mark.parametrize("with_reg", [True, False])
def test_the_teachers_two_steps_by_hand(with_reg):
    """K = 2: the first step self-conditioned on the teacher's own prediction with q = 0 (row 0)
    or on zeros (row 1), the second on the first step's prediction; the targets invert the
    two-step end to one step of span h, for the text and for the REG state."""
    g = torch.Generator().manual_seed(0)
    b, length, d, d_r = 2, 5, 3, 4
    x, z = torch.randn(b, length, d, generator=g), torch.randn(b, length, d, generator=g)
    prompt = torch.tensor([[True, True, False, False, False], [True, False, False, False, False]])
    z = torch.where(prompt[..., None], x, z)
    r = torch.randn(b, d_r, generator=g) if with_reg else None
    times = torch.tensor([[0.2, 0.3, 0.45], [0.5, 0.52, 0.75]])
    w = torch.tensor([2.0, 0.5])
    sc = torch.tensor([True, False])
    teacher = LinearTeacher(d_r if with_reg else None)
    got = teacher_targets(teacher, x, prompt, z, r, times, w, sc, FlowConfig(c_min=0.05))

    zero_q = torch.where(prompt[..., None], x, torch.zeros_like(x))
    zero_rq = None if r is None else torch.zeros_like(r)
    q0, rq0 = teacher.predict(z, zero_q, w, prompt, r, zero_rq)
    q = torch.where(sc[:, None, None], q0, zero_q)
    rq = None if r is None else torch.where(sc[:, None], rq0, zero_rq)
    y, ry = z, r
    for j in range(2):
        t, t_next = times[:, j], times[:, j + 1]
        d, rd = teacher.predict(y, q, w, prompt, ry, rq)
        step = (t_next - t)[:, None, None] / c_t(t)[:, None, None]
        y = torch.where(prompt[..., None], x, y + step * (d - y))
        if r is not None:
            ry = ry + step[:, :, 0] * (rd - ry)
        q, rq = d, rd
    c0 = c_t(times[:, 0])
    span = (times[:, 2] - times[:, 0])
    want = z + (c0 / span)[:, None, None] * (y - z)
    assert torch.allclose(got.x, want, atol=1e-6)
    assert torch.equal(got.x[prompt], x[prompt])  # prompt positions: the clean prompt
    assert torch.allclose(got.q, torch.where(sc[:, None, None], q0, zero_q))
    if with_reg:
        assert torch.allclose(got.reg, r + (c0 / span)[:, None] * (ry - r), atol=1e-6)
        assert not torch.allclose(got.reg, r)  # REG moved with the text
    else:
        assert got.reg is None
    # the self-conditioning call (row 0 only), then one call of both rows per step, each at its w
    assert [c["rows"] for c in teacher.calls] == [1, 2, 2]
    assert all(torch.equal(c["w"], w[:c["rows"]]) for c in teacher.calls[1:])
    assert got.calls.tolist() == [3, 2]


def _student(extra_token: str, seed: int = 0) -> Student:
    torch.manual_seed(seed)
    cfg = ModelConfig(width=16, depth=1, heads=2, bottleneck=4, time_freq_dim=8, repa=False, extra_token=extra_token,
                      repa_block=1)
    student = Student(cfg, enc_dim=3, vocab_size=7, teacher_dim=4 if extra_token == "reg" else None)
    with torch.no_grad():  # heads that predict something (ELF's zero init would make x̂ = 0)
        for p in student.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    return student


def _batch(b: int = 6, length: int = 5, d: int = 3, d_r: int | None = 4) -> TrainBatch:
    g = torch.Generator().manual_seed(3)
    prompt = torch.zeros(b, length, dtype=torch.bool)
    prompt[:, :2] = True
    tokens = torch.randint(0, 7, (b, length), generator=g)
    canvas = Canvas(tokens, prompt, ~prompt, torch.zeros_like(prompt), prompt.sum(1), torch.full((b,), length))
    reg = None if d_r is None else TeacherTargets(torch.zeros(b, length, 4), torch.randn(b, d_r, generator=g),
                                                  torch.zeros(b, 4))
    return TrainBatch(canvas, torch.randn(b, length, d, generator=g), reg)


def test_the_whole_loss_is_its_pieces():
    """The objective's loss equals distill_terms of its pieces computed apart: the inputs of Eq. 1
    at t_s (the decode rows' perturbed states at t = 1), the teacher's targets, the student's
    prediction from the same input and self-conditioning, the decoder's cross-entropy."""
    flow, loss = FlowConfig(decode_prob=0.4), LossConfig(reg_weight=0.1)
    student, batch, span = _student("reg"), _batch(), 0.5
    teacher = LinearTeacher(4)
    draws = draw_distill((6, 5, 3), 4, 3, flow, "logit-normal", "logit-normal", torch.Generator().manual_seed(4))
    assert draws.decode.any() and (~draws.decode).any() and (draws.self_cond & ~draws.decode).any()
    got = distill_loss(student, teacher, batch, flow, loss, span, draws)

    x, prompt, dec = batch.x, batch.canvas.prompt_mask, draws.decode
    t_s, _ = student_span(draws.u, span)
    z = torch.where(prompt[..., None], x, add_noise(x, t_s, flow.sigma, draws.noise))
    r = batch.teacher.reg
    r_s = add_noise(r, t_s, flow.sigma, draws.reg_noise)
    rows = (~dec).nonzero().squeeze(1)
    tt = teacher_targets(LinearTeacher(4), x[rows], prompt[rows], z[rows], r_s[rows],
                         substep_times(t_s[rows], span, draws.inner[rows]), draws.w[rows], draws.self_cond[rows], flow)
    q = torch.zeros_like(x).index_copy(0, rows, tt.q)
    rq = torch.zeros_like(r).index_copy(0, rows, tt.reg_q)
    z_in = torch.where(dec[:, None, None], perturb_for_decoding(x, draws.lam, 1.0, draws.decode_noise), z)
    r_in = torch.where(dec[:, None], perturb_for_decoding(r, draws.lam[:, 0], 1.0, draws.reg_decode_noise), r_s)
    out = student(z_in, q, torch.where(dec, 1.0, t_s), draws.w, prompt, decode=dec, reg=r_in, reg_self_cond=rq)
    ce = torch.nn.functional.cross_entropy(student.decode_logits(out.hidden).transpose(1, 2), batch.canvas.tokens,
                                           reduction="none") * dec[:, None]
    x_star = torch.zeros_like(x).index_copy(0, rows, tt.x)
    r_star = torch.zeros_like(r).index_copy(0, rows, tt.reg)
    want = distill_terms(out.x_hat, x_star, ce, ~prompt, dec, prediction_sq_error(out.reg_hat, r_star), 0.1)
    for name in ("total", "elf", "denoise", "decode", "reg"):
        assert getattr(got, name).item() == pytest.approx(getattr(want, name).item(), rel=1e-5), name
    assert got.reg.item() > 0 and got.decode.item() > 0 and got.repa.item() == 0
    got.total.backward()
    assert all(head.linear.weight.grad.abs().sum() > 0 for head in (student.final_layer, student.reg_head))


def test_a_rank_share_gives_its_part_of_the_global_loss():
    """Two halves of a batch, each normalised by the global counts (what reduce_counts gives under
    torchrun), add up to the whole batch's loss and draw the same per-row targets."""
    flow, loss = FlowConfig(decode_prob=0.4), LossConfig()
    student, batch = _student("none"), _batch(d_r=None)
    draws = draw_distill((6, 5, 3), None, 2, flow, "uniform", "logit-normal", torch.Generator().manual_seed(9))
    whole = distill_loss(student, LinearTeacher(None), batch, flow, loss, 0.25, draws)
    counts = torch.stack([torch.tensor(6.0), (~draws.decode).sum().float(), draws.decode.sum().float()])
    parts = []
    for half in (slice(0, 3), slice(3, 6)):
        canvas = Canvas(*(t[half] for t in batch.canvas._fields()))
        share = type(draws)(**{k: None if v is None else v[half] for k, v in draws.__dict__.items()})
        parts.append(distill_loss(student, LinearTeacher(None), TrainBatch(canvas, batch.x[half]), flow, loss, 0.25,
                                  share, reduce_counts=lambda _: counts))
    for name in ("total", "elf", "denoise", "decode"):
        assert sum(getattr(p, name).item() for p in parts) == pytest.approx(getattr(whole, name).item(), rel=1e-5)


def test_a_student_without_sc_cfg_tokens_is_distilled_from_unguided_steps():
    """ELF's step does not guide a teacher without SC-CFG tokens by calls: w = 1 everywhere."""
    flow = FlowConfig(decode_prob=0.0)
    torch.manual_seed(0)
    cfg = ModelConfig(width=16, depth=1, heads=2, bottleneck=4, time_freq_dim=8, repa=False, extra_token="none",
                      cfg_tokens=0, repa_block=1)
    student, teacher = Student(cfg, enc_dim=3, vocab_size=7), LinearTeacher(None)
    draws = draw_distill((6, 5, 3), None, 2, flow, "uniform", "uniform", torch.Generator().manual_seed(1))
    distill_loss(student, teacher, _batch(d_r=None), flow, LossConfig(), 0.5, draws)
    assert all(torch.equal(c["w"], torch.ones(c["rows"])) for c in teacher.calls)


def test_a_reg_student_needs_its_teachers_reg_targets():
    flow = FlowConfig()
    draws = draw_distill((6, 5, 3), 4, 2, flow, "uniform", "uniform", torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="REG targets"):
        distill_loss(_student("reg"), LinearTeacher(4), _batch(d_r=None), flow, LossConfig(), 0.5, draws)


def test_the_implied_target_of_a_one_step_teacher_is_its_prediction():
    """K = 1 (ELF's fast path: the teacher's own prediction at t_s is the target)."""
    g = torch.Generator().manual_seed(2)
    x, z = torch.randn(2, 4, 3, generator=g), torch.randn(2, 4, 3, generator=g)
    prompt = torch.zeros(2, 4, dtype=torch.bool)
    teacher = LinearTeacher(None)
    times = torch.tensor([[0.1, 0.6], [0.3, 0.8]])
    got = teacher_targets(teacher, x, prompt, z, None, times, torch.tensor([1.0, 3.0]), torch.tensor([False, False]),
                          FlowConfig())
    direct, _ = teacher.predict(z, torch.zeros_like(z), torch.tensor([1.0, 3.0]), prompt, None, None)
    assert torch.allclose(got.x, direct, atol=1e-6)
    assert torch.allclose(implied_prediction(z, z + 0.5 * (direct - z) / c_t(times[:, 0])[:, None, None],
                                             times[:, 0], times[:, 1]), direct, atol=1e-6)
