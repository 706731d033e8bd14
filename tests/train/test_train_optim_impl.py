"""The AdamW implementations (for-loop, foreach, fused) give the same weights: the fused kernel
training uses by default changes no number of training beyond float rounding."""

from __future__ import annotations

import pytest
import torch

from elfreg.config import ModelConfig, TrainConfig
from elfreg.model.student import Student
from elfreg.train.optim import adamw_kwargs, make_optimizer


def _trained(impl: str, steps: int = 5) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = Student(ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=32, time_freq_dim=16),
                    enc_dim=16, vocab_size=40, teacher_dim=24)
    opt = make_optimizer(model, TrainConfig(optimizer="adamw", lr=1e-2, weight_decay=0.1), impl)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("impl", ["foreach", "fused", "auto"])
def test_adamw_implementations_give_the_same_weights(impl):
    reference, other = _trained("for-loop"), _trained(impl)
    moved = [k for k in reference if not torch.equal(reference[k], _trained("for-loop", steps=0)[k])]
    assert moved  # the steps did change the weights
    for k in reference:
        torch.testing.assert_close(other[k], reference[k], rtol=1e-5, atol=1e-6)


def test_auto_is_fused_on_plain_cpu_parameters():
    assert adamw_kwargs([torch.nn.Parameter(torch.zeros(2))]) == {"fused": True}
    assert adamw_kwargs([torch.nn.Parameter(torch.zeros(2))], "for-loop") == {"foreach": False}
