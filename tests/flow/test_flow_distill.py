"""Progressive distillation's equations (elfreg.flow.distill): the student's span, the teacher's
sub-step grid, the target whose one Euler step lands where the teacher's steps land, the per-row
loss and the draws."""

from __future__ import annotations

import pytest
import torch

from elfreg.config import FlowConfig
from elfreg.flow.distill import (
    distill_terms,
    draw_distill,
    implied_prediction,
    row_means,
    student_span,
    substep_times,
)
from elfreg.flow.noising import RowDraws
from elfreg.sampling.steps import euler_update


@pytest.mark.parametrize("steps", [1, 2, 4, 16])
def test_a_student_step_spans_one_nth_and_ends_by_one(steps):
    u = torch.tensor([0.0, 0.3, 0.999, 1.0])
    t_s, t_t = student_span(u, 1 / steps)
    assert torch.allclose(t_t - t_s, torch.full_like(u, 1 / steps))
    assert float(t_s.min()) == 0.0
    if steps == 1:  # ELF's floor on 1 − h: a one-step student starts at (almost) 0, the noise
        assert float(t_s.max()) == pytest.approx(1e-6) and float(t_t.max()) <= 1 + 2e-6
    else:
        assert float(t_t.max()) <= 1 + 1e-7


def test_the_teachers_grid_is_sorted_inside_the_span_from_start_to_end():
    t_s = torch.tensor([0.1, 0.5])
    inner = torch.tensor([[0.9, 0.2, 0.5], [0.0, 1.0, 0.25]])
    times = substep_times(t_s, 0.25, inner)
    assert times.shape == (2, 5)
    assert torch.allclose(times[0], torch.tensor([0.1, 0.15, 0.225, 0.325, 0.35]))
    assert torch.allclose(times[1], torch.tensor([0.5, 0.5, 0.5625, 0.75, 0.75]))
    one = substep_times(t_s, 0.5, torch.zeros(2, 0))  # K = 1: the student's own step
    assert torch.allclose(one, torch.tensor([[0.1, 0.6], [0.5, 1.0]]))


@pytest.mark.parametrize("t_s", [0.0, 0.4, 0.97])
def test_the_target_is_the_prediction_whose_one_euler_step_reaches_the_teachers_end(t_s):
    """One Euler step of Eq. 12 (the sampler's own update) from (z_{t_s}, t_s) with the target as
    its prediction lands on the teacher's end state, also where c_t is clamped (1 − t_s < c_min)."""
    g = torch.Generator().manual_seed(0)
    z, z_end = torch.randn(3, 5, 4, generator=g), torch.randn(3, 5, 4, generator=g)
    start = torch.full((3,), t_s)
    end = start + torch.tensor([0.02, 0.03, 0.03])
    x_star = implied_prediction(z, z_end, start, end, c_min=0.05)
    assert torch.allclose(euler_update(z, x_star, start, end, 0.05), z_end, atol=1e-5)
    reg, reg_end = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    r_star = implied_prediction(reg, reg_end, start, end, c_min=0.05)
    assert torch.allclose(euler_update(reg, r_star, start, end, 0.05), reg_end, atol=1e-5)


def test_a_straight_flow_is_its_own_target_at_any_number_of_teacher_steps():
    """A teacher that always predicts the same clean state x moves z on the straight line to x,
    which Euler steps follow exactly: the end of K steps is one step's, and the target is x."""
    g = torch.Generator().manual_seed(1)
    x, z = torch.randn(2, 4, 3, generator=g), torch.randn(2, 4, 3, generator=g)
    t_s, span = torch.tensor([0.2, 0.6]), 0.25
    for inner in (torch.zeros(2, 0), torch.rand(2, 5, generator=g)):
        times = substep_times(t_s, span, inner)
        y = z
        for j in range(times.shape[1] - 1):
            y = euler_update(y, x, times[:, j], times[:, j + 1], 0.05)
        assert torch.allclose(implied_prediction(z, y, times[:, 0], times[:, -1]), x, atol=1e-5)


def test_the_loss_is_the_mean_over_rows_of_each_rows_term():
    x_hat = torch.tensor([[[1.0, 1.0], [0.0, 0.0], [2.0, 0.0]], [[0.0] * 2] * 3, [[3.0, 1.0], [1.0, 1.0], [0.0, 0.0]]])
    x_star = torch.zeros_like(x_hat)
    answer = torch.tensor([[False, True, True], [True, True, True], [True, True, False]])
    decode = torch.tensor([False, True, False])
    ce = torch.tensor([[9.0, 9.0, 9.0], [1.0, 2.0, 3.0], [9.0, 9.0, 9.0]])  # read on decode rows only
    reg_error = torch.tensor([4.0, 100.0, 2.0])
    terms = distill_terms(x_hat, x_star, ce, answer, decode, reg_error, 0.5)
    # row 0: positions 1, 2 → (0 + 2)/2 = 1; row 2: positions 0, 1 → (5 + 1)/2 = 3; row 1: CE mean 2
    assert terms.denoise.item() == pytest.approx(2.0) and terms.decode.item() == pytest.approx(2.0)
    assert terms.reg.item() == pytest.approx(3.0)  # the distillation rows' REG errors: (4 + 2)/2
    assert terms.elf.item() == pytest.approx((1 + 2 + 3) / 3)
    assert terms.total.item() == pytest.approx((1 + 0.5 * 4 + 2 + 3 + 0.5 * 2) / 3)
    # a rank's share of a global batch: its sums over the global batch's counts; the shares add up
    counts = (torch.tensor(3.0), torch.tensor(2.0), torch.tensor(1.0))
    parts = [distill_terms(x_hat[r], x_star[r], ce[r], answer[r], decode[r], reg_error[r], 0.5, counts)
             for r in (slice(0, 1), slice(1, 3))]
    for name in ("total", "elf", "denoise", "decode", "reg"):
        assert sum(getattr(p, name).item() for p in parts) == pytest.approx(getattr(terms, name).item())
    assert row_means(ce, torch.zeros_like(answer)).tolist() == [0.0, 0.0, 0.0]


def test_a_rows_draws_depend_on_its_generator_alone():
    flow = FlowConfig(decode_prob=0.3)
    gens = [torch.Generator().manual_seed(s) for s in (5, 6, 7)]
    whole = draw_distill((3, 4, 2), 3, 4, flow, "logit-normal", "uniform", RowDraws(gens))
    alone = draw_distill((1, 4, 2), 3, 4, flow, "logit-normal", "uniform", RowDraws([torch.Generator().manual_seed(6)]))
    for name in ("u", "decode", "self_cond", "w", "lam", "noise", "decode_noise", "reg_noise", "reg_decode_noise",
                 "inner"):
        assert torch.equal(getattr(whole, name)[1:2], getattr(alone, name)), name
    assert whole.inner.shape == (3, 3) and whole.reg_noise.shape == (3, 3)
    assert float(whole.u.min()) > 0 and float(whole.u.max()) < 1 and float(whole.inner.max()) < 1
    no_reg = draw_distill((2, 4, 2), None, 1, flow, "uniform", "uniform", torch.Generator().manual_seed(0))
    assert no_reg.reg_noise is None and no_reg.inner.shape == (2, 0)
    with pytest.raises(ValueError, match="unknown distillation schedule"):
        draw_distill((2, 4, 2), None, 2, flow, "cosine", "uniform", torch.Generator())


def test_the_schedules_draw_what_they_say():
    """logit-normal: training's t distribution (sigmoid of N(−1.5, 0.8): median 0.18); uniform: U[0, 1)."""
    flow = FlowConfig()
    g = torch.Generator().manual_seed(0)
    logit = draw_distill((20000, 1, 1), None, 1, flow, "logit-normal", "uniform", g).u
    uniform = draw_distill((20000, 1, 1), None, 1, flow, "uniform", "uniform", g).u
    assert float(logit.median()) == pytest.approx(float(torch.sigmoid(torch.tensor(-1.5))), abs=0.01)
    assert float(uniform.median()) == pytest.approx(0.5, abs=0.01)
