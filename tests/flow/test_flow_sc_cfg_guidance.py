"""The learned SC-CFG guidance of Eq. 7–8: auxiliary predictions at the row's w, and the fixed
point the objective trains towards.

At the fixed point of the objective (auxiliary calls at the row's w), the self-conditioned field is
f(sc, w) = u + w·(c − u), with u the no-self-conditioning field and c what the self-conditioned
branch can fit of the data. With auxiliary calls at w = 1 it would be u + (2 − 1/w)·(c − u).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from elfreg.config import FlowConfig, LossConfig
from elfreg.flow import objective
from elfreg.flow.objective import TrainBatch, elf_reg_loss
from elfreg.text.canvas import Canvas
from elfreg.text.frozen import TeacherTargets


def _canvas(bsz: int, length: int, prompt_len: int) -> Canvas:
    pos = torch.arange(length)[None].expand(bsz, length)
    prompt = pos < prompt_len
    return Canvas(tokens=torch.zeros(bsz, length, dtype=torch.long), prompt_mask=prompt, content_mask=~prompt,
                  special_mask=torch.zeros(bsz, length, dtype=torch.bool),
                  prompt_lens=torch.full((bsz,), prompt_len), lengths=torch.full((bsz,), length))


class RecordingStudent(nn.Module):
    """A student stand-in that records (z, self-conditioning, t, w, reg, grad-enabled) of every call
    and returns a prediction that depends on every input, so the objective's arithmetic runs as for
    a real one. Like the default student it has SC-CFG tokens and takes self-conditioning; it has
    no REPA projector, and a REG token unless ``extra_token`` says otherwise."""

    def __init__(self, d: int, d_r: int, cfg_tokens: int = 4, self_conditioning: bool = True,
                 extra_token: str = "reg"):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.calls: list[SimpleNamespace] = []
        self.d_r = d_r
        self.cfg = SimpleNamespace(cfg_tokens=cfg_tokens, repa=False, extra_token=extra_token)
        self.self_conditioning = self_conditioning

    def forward(self, z, self_cond, t, w, prompt_mask, decode=None, reg=None, reg_self_cond=None, want_repa=False,
                repa_positions=None):
        self.calls.append(SimpleNamespace(z=z.detach().clone(), w=w.detach().clone(), t=t.detach().clone(),
                                          sc=None if self_cond is None else self_cond.detach().clone(),
                                          reg=None if reg is None else reg.detach().clone(),
                                          grad=torch.is_grad_enabled()))
        x_hat = self.scale * (z + (0 if self_cond is None else self_cond)) * w[:, None, None] + t[:, None, None]
        reg_hat = None if reg is None else self.scale * reg * w[:, None] + (
            0 if reg_self_cond is None else reg_self_cond)
        return SimpleNamespace(x_hat=x_hat, reg_hat=reg_hat, hidden=x_hat, repa=None)


def test_every_auxiliary_prediction_is_made_at_its_rows_w():
    torch.manual_seed(0)
    bsz, length, d, d_r = 64, 6, 4, 3
    canvas = _canvas(bsz, length, prompt_len=2)
    teacher = TeacherTargets(repa=torch.randn(bsz, length, 5), reg=torch.randn(bsz, d_r),
                             reg_repa=torch.randn(bsz, 5))
    batch = TrainBatch(canvas=canvas, x=torch.randn(bsz, length, d), teacher=teacher)
    student = RecordingStudent(d, d_r)
    flow = FlowConfig(decode_prob=0.0, sc_prob=0.5)
    elf_reg_loss(student, batch, flow, LossConfig(), torch.Generator().manual_seed(1))

    main = [c for c in student.calls if c.grad]
    aux = [c for c in student.calls if not c.grad]
    assert len(main) == 1 and len(aux) == 2, "one main pass and two auxiliary passes (no-sc, then sc)"
    w_main = main[0].w
    assert w_main.unique().numel() > 10, "the test needs rows with many different w"
    for call in aux:
        # match each auxiliary row to its row of the main pass by its noisy input (text and REG)
        for z_row, w_row, r_row in zip(call.z, call.w, call.reg, strict=True):
            same = [(main[0].z[i] == z_row).all() and (main[0].reg[i] == r_row).all() for i in range(bsz)]
            (row,) = [i for i, s in enumerate(same) if s]
            assert w_row == w_main[row], f"auxiliary call at w={float(w_row)}, its row was drawn w={float(w_main[row])}"


class TabularGuidedField(nn.Module):
    """An analytic student: one set of parameters per guidance value in ``scales``.

    Without self-conditioning (sc = 0) it ignores z and predicts a constant a_w (the unconditional
    field u: it can only learn E[x]); with self-conditioning it predicts α_w ⊙ z + β_w, the best
    linear predictor of x from z (the conditional field c). Both are exact least-squares fits, so
    the objective's fixed point can be written down (module docstring)."""

    def __init__(self, scales: list[float], d: int):
        super().__init__()
        # w and q are inputs; no REPA projector, no extra token
        self.cfg = SimpleNamespace(cfg_tokens=4, repa=False, extra_token="none")
        self.self_conditioning = True
        self.register_buffer("scales", torch.tensor(scales))
        k = len(scales)
        self.a = nn.Parameter(torch.full((k, d), 0.3))
        self.alpha = nn.Parameter(torch.zeros(k, d))
        self.beta = nn.Parameter(torch.zeros(k, d))

    def index(self, w: torch.Tensor) -> torch.Tensor:
        return (w[:, None] - self.scales[None]).abs().argmin(dim=1)

    def field(self, z: torch.Tensor, w: torch.Tensor, conditioned: torch.Tensor) -> torch.Tensor:
        k = self.index(w)
        uncond = self.a[k][:, None, :].expand_as(z)
        cond = self.alpha[k][:, None, :] * z + self.beta[k][:, None, :]
        return torch.where(conditioned[:, None, None], cond, uncond)

    def forward(self, z, self_cond, t, w, prompt_mask, decode=None, reg=None, reg_self_cond=None, want_repa=False,
                repa_positions=None):
        # self-conditioned when q is non-zero at answer positions (prompt positions hold the prompt)
        conditioned = (self_cond * (~prompt_mask)[..., None]).flatten(1).abs().sum(1) > 0
        x_hat = self.field(z, w, conditioned)
        return SimpleNamespace(x_hat=x_hat, reg_hat=None, hidden=x_hat, repa=None)


SCALES = [1.0, 1.5, 2.0, 3.0, 5.0]


class AuxiliaryAtWOne(nn.Module):
    """Wraps a student so that its no-gradient (auxiliary) calls run at w = 1: the behaviour the
    objective must not have, used to show that the fixed-point check can fail."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.cfg, self.self_conditioning = inner.cfg, inner.self_conditioning

    def forward(self, z, self_cond, t, w, *args, **kwargs):
        if not torch.is_grad_enabled():
            w = torch.ones_like(w)
        return self.inner(z, self_cond, t, w, *args, **kwargs)


def _train_analytic(monkeypatch, wrap=lambda m: m) -> tuple[TabularGuidedField, torch.Tensor]:
    """Trains the analytic student with the real objective, w drawn from ``SCALES``. The learned
    guidance converges w times slower than the plain fit (each step moves the self-conditioned
    field by 1/w of its distance to the fixed point), hence the long constant-lr phase."""

    def discrete_w(n, w_min, w_max, generator):
        pick = torch.randint(len(SCALES), (n,), generator=generator, device=generator.device)
        return torch.tensor(SCALES)[pick]

    monkeypatch.setattr(objective, "sample_guidance_scale", discrete_w)
    torch.manual_seed(0)
    bsz, d = 4096, 2
    mean = torch.tensor([1.0, -2.0])
    canvas = _canvas(bsz, 2, prompt_len=1)
    student = TabularGuidedField(SCALES, d)
    net = wrap(student)
    opt = torch.optim.Adam(student.parameters(), lr=0.05)
    steps = 1500
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.01 ** max(0.0, 3 * s / steps - 2))
    # small σ and mid-range t make z informative about x, so c and u differ clearly
    flow = FlowConfig(decode_prob=0.0, sc_prob=0.5, sigma=0.5, t_logit_mean=0.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = mean + torch.randn(bsz, 2, d, generator=gen)
        out = elf_reg_loss(net, TrainBatch(canvas, x), flow, LossConfig(), gen)
        opt.zero_grad()
        out.total.backward()
        opt.step()
        sched.step()
    return student, mean


def _guidance_errors(student: TabularGuidedField, mean: torch.Tensor, factor) -> dict[float, float]:
    """Relative error of f(sc, w) − u against factor(w)·(c − u), over a grid of z, per w > 1."""
    d = mean.numel()
    with torch.no_grad():
        z = torch.linspace(-4, 4, 17)[:, None, None].expand(17, 1, d).contiguous()
        on = torch.ones(17, dtype=torch.bool)

        def at(w: float, conditioned: bool) -> torch.Tensor:
            return student.field(z, torch.full((17,), w), on if conditioned else ~on)

        for w in SCALES:  # every no-sc field learns u = E[x]
            assert torch.allclose(at(w, False)[0, 0], mean, atol=0.05), (w, at(w, False)[0, 0])
        u, c = at(1.0, False), at(1.0, True)  # at w = 1 the target has no guidance term: c itself
        assert (c - u).abs().max() > 1.0, "the analytic setting needs c and u to differ"
        errors = {}
        for w in SCALES[1:]:
            expected = factor(w) * (c - u)
            errors[w] = float((at(w, True) - at(w, False) - expected).norm() / expected.norm())
    return errors


def test_training_with_the_target_makes_the_guided_field_u_plus_w_times_c_minus_u(monkeypatch):
    """Tolerance: f(sc, w) − u equals w·(c − u) within 3 % (relative, over a grid of z)."""
    student, mean = _train_analytic(monkeypatch)
    errors = _guidance_errors(student, mean, lambda w: w)
    assert max(errors.values()) < 0.03, errors


def test_auxiliary_calls_at_w_one_would_train_a_weaker_guidance(monkeypatch):
    # the same check fails when the auxiliary calls run at w = 1: the field then ends at
    # u + (2 − 1/w)·(c − u), 44 % short of w·(c − u) at w = 3
    student, mean = _train_analytic(monkeypatch, wrap=AuxiliaryAtWOne)
    assert _guidance_errors(student, mean, lambda w: 2 - 1 / w)[3.0] < 0.03
    assert _guidance_errors(student, mean, lambda w: w)[3.0] > 0.3


def _plain_batch(bsz: int = 16, length: int = 6, d: int = 4) -> TrainBatch:
    torch.manual_seed(3)
    return TrainBatch(canvas=_canvas(bsz, length, prompt_len=2), x=torch.randn(bsz, length, d))


def _plain_target_loss(student: RecordingStudent, batch: TrainBatch, main: SimpleNamespace) -> torch.Tensor:
    """L_ELF of the main pass against the plain target (x − z)/c_t, from the pass's own inputs."""
    with torch.no_grad():
        x_hat = student.scale * (main.z + (0 if main.sc is None else main.sc)) * main.w[:, None, None] \
            + main.t[:, None, None]
        c = (1 - main.t).clamp(min=0.05)[:, None, None]
        err = ((x_hat - main.z) / c - (batch.x - main.z) / c).pow(2).mean(-1)
        answer = batch.canvas.answer_mask
        return (err * answer).sum() / answer.sum()


def test_without_sc_cfg_tokens_the_target_is_plain_and_only_the_self_conditioning_input_is_made():
    """ELF's training step for a model without SC-CFG tokens: the no-sc prediction as the
    self-conditioning input of the rows with b = 1, no second auxiliary call, the plain target."""
    batch, flow, loss = _plain_batch(), FlowConfig(decode_prob=0.0, sc_prob=0.5), LossConfig()
    plain = RecordingStudent(4, 3, cfg_tokens=0, extra_token="none")
    terms = elf_reg_loss(plain, batch, flow, loss, torch.Generator().manual_seed(5))
    aux, (main,) = [c for c in plain.calls if not c.grad], [c for c in plain.calls if c.grad]
    assert len(aux) == 1 and 0 < aux[0].z.shape[0] < 16  # the rows with b = 1 only
    assert (main.sc[:, 2:] != 0).any(dim=(1, 2)).sum() == aux[0].z.shape[0]  # their input is that prediction
    assert torch.allclose(terms.elf, _plain_target_loss(plain, batch, main), rtol=1e-5)
    guided = RecordingStudent(4, 3, cfg_tokens=4, extra_token="none")  # same draws, w an input: guided target
    guided_terms = elf_reg_loss(guided, batch, flow, loss, torch.Generator().manual_seed(5))
    assert len([c for c in guided.calls if not c.grad]) == 2
    assert not torch.allclose(guided_terms.elf, _plain_target_loss(guided, batch, guided.calls[-1]), rtol=1e-3)


def test_without_self_conditioning_the_student_gets_z_alone_and_no_auxiliary_call():
    batch, loss = _plain_batch(), LossConfig()
    student = RecordingStudent(4, 3, cfg_tokens=0, self_conditioning=False, extra_token="none")
    terms = elf_reg_loss(student, batch, FlowConfig(decode_prob=0.0, sc_prob=0.0), loss, torch.Generator())
    (main,) = student.calls
    assert main.grad and main.sc is None  # ELF's z-wide input: self_cond_proj bypassed
    assert torch.allclose(terms.elf, _plain_target_loss(student, batch, main), rtol=1e-5)
    with pytest.raises(ValueError, match="built without self-conditioning"):
        elf_reg_loss(student, batch, FlowConfig(sc_prob=0.5), loss, torch.Generator())
