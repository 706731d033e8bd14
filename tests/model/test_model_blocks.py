"""The attention block's qk-norm and RoPE: the rotation's invariants, one rounding under bf16, and
attention as two batched matmuls where SDPA's CPU kernel is the slower (bf16 calls without gradient)."""

import pytest
import torch
import torch.nn.functional as F

from elfreg.model.blocks import Attention, apply_rope, attention_in_matmuls, rope_tables, softmax_attention


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


def _heads(seed=0, b=2, h=3, s=37, d=16):
    g = torch.Generator().manual_seed(seed)
    q, k = (F.rms_norm(torch.randn(b, h, s, d, generator=g), (d,)) * 2 for _ in range(2))
    # v as the block makes it: a strided view of one (B, S, 3, heads, head_dim) projection
    v = torch.randn(b, s, 3, h, d, generator=g).permute(2, 0, 3, 1, 4)[2]
    return q, k, v


def test_softmax_attention_is_sdpa_in_fp32_and_close_to_it_in_bf16():
    q, k, v = _heads()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    got = softmax_attention(q * 16 ** -0.5, k, v)
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert torch.allclose(got.double(), ref, atol=1e-6)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    err = (softmax_attention((q * 16 ** -0.5).bfloat16(), kb, vb).double() - ref).norm() / ref.norm()
    sdpa = (F.scaled_dot_product_attention(qb, kb, vb).double() - ref).norm() / ref.norm()
    # bf16 scores add one rounding to SDPA's: the same order of error, not a new one
    assert err < 2 * sdpa + 1e-3 and err < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_attention_groups_change_no_value(dtype):
    q, k, v = (a.to(dtype) for a in _heads(b=3, h=4))
    whole = softmax_attention(q, k, v)
    matrix = 37 * 37 * q.element_size()
    for most in (1, 5 * matrix, 7 * matrix + 1):  # one matrix, groups that do not divide 12
        assert torch.equal(softmax_attention(q, k, v, scores_bytes=most), whole)


def test_attention_runs_in_matmuls_only_in_cpu_bf16_calls_without_gradient():
    x = torch.randn(2, 5, 8)
    assert not attention_in_matmuls(x)  # fp32: SDPA's kernel was the faster
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not attention_in_matmuls(x)  # training: SDPA's backward stores no score matrix
        with torch.no_grad():
            assert attention_in_matmuls(x)
    with torch.no_grad():
        assert attention_in_matmuls(x.bfloat16()) and not attention_in_matmuls(x)


def test_attention_block_takes_each_path_where_it_should():
    attn = _attention()
    x = torch.randn(2, 37, 64)
    cos, sin = rope_tables(torch.arange(37), 16, 10_000.0)

    def sdpa_out():
        out = F.scaled_dot_product_attention(*attn.qkv_heads(x, cos, sin))
        return attn.proj(out.transpose(1, 2).reshape(2, 37, 64))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            got = attn(x, cos, sin)
            q, k, v = attn.qkv_heads(x, cos, sin, q_scale=0.25)
            matmuls = attn.proj(softmax_attention(q, k, v).transpose(1, 2).reshape(2, 37, 64))
            sdpa = sdpa_out()
        assert torch.equal(got, matmuls)
        assert torch.allclose(got.float(), sdpa.float(), atol=0.03)
        assert torch.equal(attn(x, cos, sin), sdpa_out())  # with gradient: SDPA
    with torch.no_grad():
        assert torch.equal(attn(x, cos, sin), sdpa_out())  # fp32: SDPA


def test_q_scale_scales_q_only():
    attn = _attention()
    x = torch.randn(2, 9, 64)
    cos, sin = rope_tables(torch.arange(9), 16, 10_000.0)
    q, k, v = attn.qkv_heads(x, cos, sin)
    qs, ks, vs = attn.qkv_heads(x, cos, sin, q_scale=0.25)
    assert torch.equal(qs, q * 0.25) and torch.equal(ks, k) and torch.equal(vs, v)  # a power of two: exact
