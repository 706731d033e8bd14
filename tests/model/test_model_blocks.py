"""The attention block's qk-norm and RoPE: the rotation's invariants, and one rounding under bf16."""

import torch
import torch.nn.functional as F

from elfreg.model.blocks import Attention, apply_rope, rope_tables


def _rotated(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = rope_tables(positions, x.shape[-1], 10_000.0)
    return apply_rope(x, cos, sin)


def test_rope_keeps_norms_and_scores_depend_on_relative_position_only():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 5, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8, dtype=torch.float64)
    pos = torch.arange(5)
    rq, rk = _rotated(q.float(), pos).double(), _rotated(k.float(), pos).double()
    # each (i, i + d/2) pair is rotated: the vector's norm is unchanged
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    # shifting every position by 7 leaves every q_i · k_j unchanged
    sq, sk = _rotated(q.float(), pos + 7).double(), _rotated(k.float(), pos + 7).double()
    assert torch.allclose(rq @ rk.transpose(-1, -2), sq @ sk.transpose(-1, -2), atol=1e-4)
    # ... but the scores do depend on the positions (position 0 is the identity)
    assert torch.equal(_rotated(q.float(), torch.zeros(5, dtype=torch.long)), q.float())
    assert not torch.allclose(rq @ rk.transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-2)


def _attention(width=64, heads=4, seed=0) -> Attention:
    torch.manual_seed(seed)
    attn = Attention(width, heads)
    for norm in (attn.q_norm, attn.k_norm):
        torch.nn.init.uniform_(norm.weight, 0.5, 2.0)
    return attn


def test_attention_equals_the_written_out_equations_in_fp32():
    attn = _attention()
    x = torch.randn(2, 6, 64)
    cos, sin = rope_tables(torch.arange(6), 16, 10_000.0)
    q, k, v = attn.qkv(x).view(2, 6, 3, 4, 16).permute(2, 0, 3, 1, 4)

    def norm_rope(a, norm):
        a = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight
        return apply_rope(a, cos, sin)

    q, k = norm_rope(q, attn.q_norm), norm_rope(k, attn.k_norm)
    scores = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
    expected = attn.proj((scores @ v).transpose(1, 2).reshape(2, 6, 64))
    assert torch.allclose(attn(x, cos, sin), expected, atol=1e-5)


def test_qk_norm_and_rope_round_once_under_bf16():
    attn = _attention()
    x = torch.randn(3, 40, 64)
    cos, sin = rope_tables(torch.arange(40), 16, 10_000.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = attn.qkv_heads(x, cos, sin)
        raw = attn.qkv(x).view(3, 40, 3, 4, 16).permute(2, 0, 3, 1, 4)
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16
    for got, a, norm in ((q, raw[0], attn.q_norm), (k, raw[1], attn.k_norm)):
        normed = F.rms_norm(a.float(), (16,), norm.weight, norm.eps)
        once = apply_rope(normed, cos, sin).to(torch.bfloat16)
        twice = apply_rope(normed.to(torch.bfloat16).float(), cos, sin).to(torch.bfloat16)
        assert torch.equal(got, once)
        assert not torch.equal(got, twice)  # a rounding between norm and RoPE would show
    assert torch.equal(v, raw[2])
