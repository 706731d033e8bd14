"""The trajectory metrics against hand-computed values on handwritten stub trajectories."""

from __future__ import annotations

import math

import pytest
import torch

from elfreg.analysis import trajectory_metrics as tm
from elfreg.analysis.measure import Plan

EOS = 0
# four observations (the last is the endpoint) of a five-position answer region
END = torch.tensor([7, 8, 9, EOS, EOS])
TOKENS = torch.tensor([
    [7, 1, 9, EOS, EOS],  # position 2 equals the endpoint now but not at the next observation
    [7, 8, 2, EOS, EOS],
    [7, 8, 9, EOS, 5],    # position 4 lies after the endpoint's first EOS: not counted
    [7, 8, 9, EOS, EOS],
])


def test_answer_span_covers_the_answer_and_its_first_eos():
    assert tm.answer_span(END, EOS) == 4
    assert tm.answer_span(torch.tensor([EOS, EOS, EOS]), EOS) == 1
    assert tm.answer_span(torch.tensor([4, 5, 6]), EOS) == 3  # no EOS: the whole region


def test_stable_tokens_need_agreement_now_and_at_every_later_observation():
    stable = tm.stable_token_fraction(TOKENS, END, tm.answer_span(END, EOS))
    # s0: positions 0 and 3 (position 2 matches now, differs at s1: not stable); s1: 0, 1, 3
    assert stable.tolist() == [2 / 4, 3 / 4, 1.0, 1.0]
    assert torch.all(stable.diff() >= 0)
    # a token that returns to the endpoint's value only at the last observation is stable only there
    flicker = torch.tensor([[3], [4], [3], [4], [3]])
    assert tm.stable_token_fraction(flicker, torch.tensor([3]), 1).tolist() == [0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="span"):
        tm.stable_token_fraction(TOKENS, END, 0)


def test_exact_agreement_compares_tokens_eos_and_length():
    assert [tm.exact_agreement(row, END, EOS) for row in TOKENS] == [False, False, True, True]
    assert tm.answer_of(torch.tensor([7, 8, 9, EOS, 5]), EOS) == ((7, 8, 9), True)
    assert not tm.exact_agreement([7, 8, 9, 4, EOS], END, EOS)  # longer answer
    assert not tm.exact_agreement([7, 8], END, EOS)  # same start, shorter, no EOS
    assert not tm.exact_agreement([7, 8, 9], [7, 8, 9, EOS], EOS)  # same tokens, EOS status differs
    assert tm.exact_agreement([-1, -1, 7, 8, 9, EOS], END, EOS)  # prompt positions (−1) are not answer


def test_answer_agreement_and_paired_flips():
    assert tm.answer_agreement("18", "18") and tm.answer_agreement(None, None)
    assert not tm.answer_agreement("18", None) and not tm.answer_agreement("18", "18.5")
    flips = tm.paired_flips([False, True, True, False, True], [True, True, False, False, True])
    assert flips == {"wrong_to_right": 1, "right_to_wrong": 1, "both_right": 2, "both_wrong": 1, "n": 5}
    with pytest.raises(ValueError):
        tm.paired_flips([True], [True, False])


def test_text_endpoint_error_is_relative_to_the_endpoint():
    end = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    pred = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert tm.endpoint_error_norm(pred, end).item() == pytest.approx(math.sqrt(5))
    assert tm.text_endpoint_error(pred, end).item() == pytest.approx(math.sqrt(5) / 2)
    assert tm.text_endpoint_error(end, end).item() == 0
    stacked = tm.text_endpoint_error(torch.stack([pred, end, 2 * end]), end)
    assert stacked.tolist() == pytest.approx([math.sqrt(5) / 2, 0.0, 1.0])


def test_acceleration_of_a_quadratic_path_is_constant():
    t = torch.linspace(0, 1, 9, dtype=torch.float64)
    v0, v1, acc = torch.randn(3, 2, 3, dtype=torch.float64).unbind(0)
    path = v0 + t[:, None, None] * v1 + 0.5 * t[:, None, None] ** 2 * acc
    a = tm.joint_acceleration(path, t)
    assert a.shape == (7,) and torch.allclose(a, acc.norm().expand(7))
    assert torch.allclose(tm.second_differences(path, 1 / 8), acc.expand(7, 2, 3))
    # a straight line has none
    assert torch.allclose(tm.joint_acceleration(v0 + t[:, None, None] * v1, t), torch.zeros(7, dtype=torch.float64))
    with pytest.raises(ValueError, match="uniform"):
        tm.joint_acceleration(path, t ** 2)
    with pytest.raises(ValueError, match="3 states"):
        tm.second_differences(path[:2], 0.1)


def test_prop2_certifies_the_decode_wherever_it_holds():
    """Prop. 2 with the GELU head's constant: whenever L·‖e‖ < m at every position, the perturbed
    hidden states decode to the same tokens. Errors are drawn so that the condition holds in some
    cases and fails in others; every case where it holds is checked."""
    torch.manual_seed(5)
    w_in, w_out = torch.randn(8, 6) / 3, torch.randn(13, 8) / 3
    lip = tm.gelu_head_logit_lipschitz(w_in, w_out)

    def head(h):
        return torch.nn.functional.gelu(h @ w_in.T, approximate="tanh") @ w_out.T

    held = 0
    for scale in torch.logspace(-3, 0, 60):
        h = torch.randn(5, 6) * 3
        e = torch.randn(5, 6)
        e = e / e.norm(dim=-1, keepdim=True) * scale
        margin = tm.logit_margin(head(h)).min()
        if tm.prop2_holds(lip, e.norm(dim=-1).max(), margin):
            held += 1
            assert torch.equal(head(h + e).argmax(-1), head(h).argmax(-1))
    assert 5 <= held < 60  # the condition held in some cases and not in all


def test_remaining_max_and_the_prop1_bound():
    assert tm.remaining_max(torch.tensor([1.0, 3.0, 2.0, 0.5])).tolist() == [3.0, 3.0, 2.0, 0.5]
    t = torch.tensor([0.5, 0.5, 0.0])
    # bound A·(1 − t)²/2: 0.125, 0.125, 0.5
    assert tm.prop1_holds(torch.tensor([0.1, 0.2, 0.5]), torch.tensor([1.0, 1.0, 1.0]), t).tolist() == [
        True, False, True]


def test_logit_margin_and_the_decoder_head_lipschitz_constant():
    assert tm.logit_margin(torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, 0.0]])).tolist() == [1.0, 0.0]
    torch.manual_seed(0)
    w_dec, w_vocab = torch.randn(6, 4), torch.randn(11, 6)  # width 4 → 6 → vocabulary 11
    lip = tm.pairwise_logit_lipschitz([w_dec, w_vocab])
    product = w_vocab @ w_dec
    assert lip == pytest.approx(math.sqrt(2) * torch.linalg.matrix_norm(product.double(), ord=2).item(), rel=1e-6)
    pairwise = (product[:, None, :] - product[None, :, :]).norm(dim=-1).max().item()
    assert pairwise <= lip + 1e-6  # a valid Lipschitz constant of every ℓ_a − ℓ_b
    assert tm.prop2_holds(2.0, 0.1, 0.3).item() and not tm.prop2_holds(2.0, 0.2, 0.3).item()
    # ELF's head has a GELU between its layers: the bound holds on random pairs of inputs
    lip_gelu = tm.gelu_head_logit_lipschitz(w_dec, w_vocab)
    h1, h2 = torch.randn(2000, 4) * 3, torch.randn(2000, 4) * 3
    logits = [torch.nn.functional.gelu(h @ w_dec.T, approximate="tanh") @ w_vocab.T for h in (h1, h2)]
    diff = (logits[0][:, :, None] - logits[0][:, None, :]) - (logits[1][:, :, None] - logits[1][:, None, :])
    assert (diff.abs().amax(dim=(1, 2)) <= lip_gelu * (h1 - h2).norm(dim=-1) + 1e-4).all()
    x = torch.linspace(-6, 6, 100001, requires_grad=True)
    slope = torch.autograd.grad(torch.nn.functional.gelu(x, approximate="tanh").sum(), x)[0].max().item()
    assert slope == pytest.approx(tm.GELU_TANH_SLOPE, abs=1e-5)
    assert tm.prop2_holds(2.0, torch.tensor([0.1, 0.15]), torch.tensor([0.3, 0.3])).tolist() == [True, False]


def test_plan_observations_and_flip_nfe():
    plan = Plan.make(512, [64, 4, 8, 16, 32], observe_every=128)
    assert plan.observe == (4, 8, 16, 32, 64, 128, 256, 384, 512) and plan.flip_nfe == 64
    assert plan.reported == (4, 8, 16, 32, 64, 512)
    assert Plan.make(32, [4, 8, 32]).flip_nfe == 8  # no 64 below M: the largest NFE below M
    assert Plan.make(32, [4, 8], observe_every=0).observe == (4, 8, 32)
    for kwargs, match in (({"nfes": [4, 600]}, "NFE"), ({"nfes": [1]}, "NFE"), ({"nfes": [32]}, "below"),
                          ({"nfes": [4], "flip_nfe": 8}, "flip"), ({"nfes": [4], "uniform": 2}, "acceleration")):
        with pytest.raises(ValueError, match=match):
            Plan.make(32, **kwargs)
