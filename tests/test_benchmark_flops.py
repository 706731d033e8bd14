"""The benchmark's FLOP count and op-time breakdown (``benchmarks/perf/flops.py``, ``breakdown.py``):
the CPU attention kernel is counted as torch counts the CUDA ones, and profiled op time is split
into matmul / attention / other."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from perf.breakdown import GROUPS, group_of, time_breakdown
from perf.flops import count, flop_counter, split

B, H, S, D = 2, 3, 10, 8


def _qkv(grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, D, generator=g).requires_grad_(grad) for _ in range(3)]


def test_cpu_attention_forward_is_two_batched_matmuls():
    q, k, v = _qkv()
    flops = count(lambda: F.scaled_dot_product_attention(q, k, v))
    # QKᵀ: (S×D)(D×S) and PV: (S×S)(S×D) per batch and head, 2 FLOPs per multiply-add
    assert flops == {"total": 4 * B * H * S * S * D, "attention": 4 * B * H * S * S * D, "matmul": 0}


def test_cpu_attention_backward_is_counted():
    q, k, v = _qkv(grad=True)
    out = F.scaled_dot_product_attention(q, k, v)
    with flop_counter() as counter:
        out.sum().backward()
    # dV = Pᵀ dO, dP = dO Vᵀ, recomputed S = QKᵀ, dQ = dS K, dK = dSᵀ Q: five (S, S, D) products
    assert split(counter)["attention"] == 5 * 2 * B * H * S * S * D


def test_matmul_and_attention_are_split():
    q, k, v = _qkv()
    a, w = torch.randn(5, 7), torch.randn(11, 7)
    flops = count(lambda: (F.linear(a, w), F.scaled_dot_product_attention(q, k, v)))
    assert flops["matmul"] == 2 * 5 * 7 * 11
    assert flops["attention"] == 4 * B * H * S * S * D
    assert flops["total"] == flops["matmul"] + flops["attention"]


@pytest.mark.parametrize("name, group", [("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "attention"),
                                         ("aten::_softmax", "attention"),
                                         ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
                                         ("aten::scaled_dot_product_attention", "attention"),
                                         ("aten::mul", "other"), ("aten::copy_", "other")])
def test_group_of(name, group):
    assert group_of(name) == group


def test_attention_in_matmuls_is_counted_as_attention():
    from elfreg.model.blocks import softmax_attention

    q, k, v = _qkv()
    a, w = torch.randn(5, 7), torch.randn(11, 7)
    flops = count(lambda: (F.linear(a, w), softmax_attention(q * D ** -0.5, k, v)))
    assert flops == {"total": 2 * 5 * 7 * 11 + 4 * B * H * S * S * D, "attention": 4 * B * H * S * S * D,
                     "matmul": 2 * 5 * 7 * 11}


def test_time_breakdown_shares_and_floors():
    q, k, v = [t.repeat(8, 4, 16, 1) for t in _qkv()]
    a, w = torch.randn(256, 256), torch.randn(256, 256)

    def call():
        F.scaled_dot_product_attention(q, k, v)
        y = F.linear(a, w)
        return (y * 2 + 1).relu()

    flops = count(call)
    call()
    bd = time_breakdown(call, flops, probe_gflops=100.0, device=torch.device("cpu"))
    assert set(GROUPS) <= set(bd)
    assert sum(bd[g]["share"] for g in GROUPS) == pytest.approx(1.0)
    assert all(bd[g]["seconds"] > 0 for g in GROUPS)
    assert bd["op_seconds"] <= bd["profiled_seconds"]
    assert bd["unattributed_seconds"] == pytest.approx(bd["profiled_seconds"] - bd["op_seconds"])
    for g in ("matmul", "attention"):  # × floor = seconds over FLOPs at the probe's speed
        assert bd[g]["flops"] == flops[g]
        assert bd[g]["over_floor"] == pytest.approx(bd[g]["seconds"] * 100e9 / flops[g])
    assert "over_floor" not in bd["other"]  # elementwise work has no FLOP count
