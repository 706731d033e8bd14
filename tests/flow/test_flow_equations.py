"""Equations of ELF-REG §3, App. A checked on random tensors and hand-computed small examples."""

import math

import pytest
import torch

from elfreg.flow.losses import repa_cosine, token_cross_entropy, velocity_sq_error, x_form_sq_error
from elfreg.flow.noising import add_noise, c_t, sample_guidance_scale, sample_logit_normal, velocity
from elfreg.flow.objective import elf_term, reg_term, repa_mask, repa_term
from elfreg.flow.targets import clean_target, sc_cfg_target
from elfreg.text.frozen import TeacherTargets

torch.manual_seed(0)


def test_noising_endpoints_and_eq1():
    x, eps = torch.randn(3, 5, 4), torch.randn(3, 5, 4)
    t = torch.tensor([0.0, 1.0, 0.25])
    z = add_noise(x, t, 2.0, eps)
    assert torch.allclose(z[0], 2.0 * eps[0])
    assert torch.allclose(z[1], x[1])
    assert torch.allclose(z[2], 0.25 * x[2] + 0.75 * 2.0 * eps[2])


def test_c_t_is_clamped_at_005():
    t = torch.tensor([0.0, 0.5, 0.95, 0.99, 1.0])
    assert torch.allclose(c_t(t), torch.tensor([1.0, 0.5, 0.05, 0.05, 0.05]))
    z, x_hat = torch.zeros(5, 2, 3), torch.ones(5, 2, 3)
    assert torch.allclose(velocity(x_hat, z, t)[:, 0, 0], 1 / torch.tensor([1.0, 0.5, 0.05, 0.05, 0.05]))


@pytest.mark.parametrize("seed", range(3))
def test_eq9_velocity_form_equals_weighted_x_form(seed):
    g = torch.Generator().manual_seed(seed)
    b_, l_, d = 6, 7, 16
    x, z, x_hat = (torch.randn(b_, l_, d, generator=g) for _ in range(3))
    v_sc, v_nosc = torch.randn(b_, l_, d, generator=g), torch.randn(b_, l_, d, generator=g)
    t = torch.tensor([0.0, 0.3, 0.9, 0.96, 0.999, 1.0])  # includes clamped times
    b = torch.tensor([1, 0, 1, 1, 0, 1])
    w = torch.tensor([0.5, 2.0, 3.0, 5.0, 1.0, 4.0])
    v_target = sc_cfg_target(x, z, t, b, w, v_sc, v_nosc)
    x_star = clean_target(z, t, v_target)
    vel = velocity_sq_error(x_hat, z, t, v_target)
    xform = x_form_sq_error(x_hat, x_star, t)
    assert torch.allclose(vel, xform, rtol=1e-4, atol=1e-4)
    # and it is ‖v_θ − v_target‖²/d by hand, with no extra c_t⁻² factor
    c = torch.clamp(1 - t, min=0.05)[:, None, None]
    by_hand = (((x_hat - z) / c - v_target) ** 2).sum(-1) / d
    assert torch.allclose(vel, by_hand, rtol=1e-5)


def test_sc_cfg_target_b0_is_data_velocity_and_w1_vanishes():
    x, z = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    v_sc, v_nosc = torch.randn(4, 3, 8) * 10, torch.randn(4, 3, 8)
    t = torch.tensor([0.1, 0.5, 0.97, 0.2])
    data_v = (x - z) / torch.clamp(1 - t, min=0.05)[:, None, None]
    b0 = sc_cfg_target(x, z, t, torch.zeros(4), torch.tensor([0.5, 2.0, 3.0, 5.0]), v_sc, v_nosc)
    assert torch.allclose(b0, data_v)
    w1 = sc_cfg_target(x, z, t, torch.ones(4), torch.ones(4), v_sc, v_nosc)
    assert torch.allclose(w1, data_v)
    w3 = sc_cfg_target(x, z, t, torch.ones(4), torch.full((4,), 3.0), v_sc, v_nosc)
    assert torch.allclose(w3, data_v + (1 - 1 / 3) * (v_sc - v_nosc), atol=1e-5)
    assert not w3.requires_grad


def test_training_distributions():
    g = torch.Generator().manual_seed(0)
    t = sample_logit_normal((200_000,), -1.5, 0.8, g)
    logit = torch.log(t / (1 - t))
    assert abs(logit.mean().item() + 1.5) < 0.01 and abs(logit.std().item() - 0.8) < 0.01
    w = sample_guidance_scale(200_000, 0.5, 5.0, g)
    assert w.min() >= 0.5 and w.max() <= 5.0
    lw = torch.log1p(w)  # 1+w log-uniform on [1.5, 6]
    assert abs(lw.mean().item() - (math.log(1.5) + math.log(6)) / 2) < 0.01


def test_elf_term_hand_computation():
    # 2 rows x 4 positions; row 0 denoise, row 1 decode; prompt = first position of each row
    vel = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 9.0, 9.0, 9.0]])
    answer = torch.tensor([[False, True, True, True], [False, True, True, True]])
    decode = torch.tensor([False, True])
    ce = torch.tensor([0.5, 1.5, 2.5])  # decode row's 3 answer positions
    # (1+2+3 + 0.5+1.5+2.5) / 6 answer positions
    assert elf_term(vel, ce, answer, decode).item() == pytest.approx((6 + 4.5) / 6)


def _teacher(repa, reg_repa):
    return TeacherTargets(repa=repa, reg=torch.zeros(repa.shape[0], repa.shape[-1]), reg_repa=reg_repa)


def test_repa_term_hand_computation():
    pred = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # 2 positions + REG position
    target = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    reg_target = torch.tensor([[0.0, 1.0]])
    content = torch.tensor([[True, True]])
    # cos: 1, 0, 1/sqrt2 -> losses 0, 1, 1 - 1/sqrt2, mean over 3 valid positions
    expected = (0 + 1 + (1 - 1 / math.sqrt(2))) / 3
    assert repa_term(pred[0], _teacher(target, reg_target), content, with_reg=True).item() == pytest.approx(expected)
    assert repa_term(pred[0, :2], _teacher(target, reg_target), content, with_reg=False).item() == pytest.approx(0.5)


def test_repa_term_reads_the_projections_of_the_masked_positions_in_row_major_order():
    b_, l_, dt = 3, 10, 6
    full, target = torch.randn(b_, l_ + 1, dt), torch.randn(b_, l_, dt)
    reg_target = torch.randn(b_, dt)
    content = torch.zeros(b_, l_, dtype=torch.bool)
    content[:, 3:7] = True  # positions 0-2 prompt, 7-9 EOS padding / special
    content[1, 7] = True  # rows of different lengths
    mask = repa_mask(content, with_reg=True)
    got = repa_term(full[mask], _teacher(target, reg_target), content, with_reg=True)
    # the equation over the whole canvas, weighted by the mask
    whole = torch.cat([target, reg_target[:, None]], dim=1)
    per_pos = 1 - torch.nn.functional.cosine_similarity(full, whole, dim=-1, eps=1e-6)
    assert got.item() == pytest.approx(((per_pos * mask).sum() / mask.sum()).item(), rel=1e-6)
    # a divisor from another rank's count, and a refusal of projections of other positions
    assert repa_term(full[mask], _teacher(target, reg_target), content, True, torch.tensor(40.0)).item() == \
        pytest.approx((per_pos * mask).sum().item() / 40, rel=1e-6)
    with pytest.raises(ValueError, match="REPA projections"):
        repa_term(full.flatten(0, 1), _teacher(target, reg_target), content, with_reg=True)


def test_reg_term_has_no_weight_on_decode_rows():
    err = torch.tensor([1.0, 3.0, 1e6, 5.0])
    decode = torch.tensor([False, False, True, False])
    assert reg_term(err, decode).item() == pytest.approx(3.0)
    err[2] = 0.0
    assert reg_term(err, decode).item() == pytest.approx(3.0)


def test_velocity_error_divides_by_d_and_ce_per_position():
    z = torch.zeros(1, 1, 4)
    err = velocity_sq_error(torch.full((1, 1, 4), 0.5), z, torch.tensor([0.5]), torch.zeros(1, 1, 4))
    assert err.item() == pytest.approx(1.0)  # v = 1 in each of 4 features, / d
    logits = torch.tensor([[[0.0, 0.0]]])
    assert token_cross_entropy(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(2))
    assert repa_cosine(torch.tensor([[1.0, 0.0]]), torch.tensor([[-2.0, 0.0]])).item() == pytest.approx(2.0)
