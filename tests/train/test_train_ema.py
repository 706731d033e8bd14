"""The EMA of the student's weights (decay ``train.ema_decay``, kept in fp32)."""

from __future__ import annotations

import torch

from elfreg.train.ema import EMA


def test_update_is_the_exponential_average_in_fp32():
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema = EMA(model, decay=0.9)
    with torch.no_grad():
        model.weight.fill_(3.0)
    ema.update(model)
    assert torch.allclose(ema.shadow["weight"], torch.full((2, 2), 0.9 * 1.0 + 0.1 * 3.0))
    assert ema.shadow["weight"].dtype == torch.float32


def test_a_loaded_state_lands_on_the_device_of_the_averages():
    """A checkpoint is read onto the CPU; the averages stay where the student is (a GPU in
    training; the meta device stands in for it here), or the next update mixes devices."""
    on_meta = EMA(torch.nn.Linear(2, 2, device="meta"), decay=0.9)
    saved = {k: torch.ones(v.shape, dtype=torch.bfloat16) for k, v in on_meta.shadow.items()}
    on_meta.load_state_dict(saved)
    assert all(v.device.type == "meta" and v.dtype == torch.float32 for v in on_meta.shadow.values())
    on_cpu = EMA(torch.nn.Linear(2, 2), decay=0.9)
    on_cpu.load_state_dict(saved)
    assert all(torch.equal(v, torch.ones_like(v)) for v in on_cpu.shadow.values())
