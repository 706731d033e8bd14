"""Transformer parts of the student, as ELF's ``modules/layers.py`` has them: RMSNorm, RoPE,
qk-normed attention with a qkv bias, SwiGLU, and the pre-norm block.

Two storage choices differ from ELF's code and change no value: RoPE rotates the halves of each
head (dimension i with i + head_dim/2) where ELF rotates adjacent pairs (2i with 2i + 1), so an
imported checkpoint has the rows of its q and k projections (and q/k-norm weights) permuted to
match (:func:`elfreg.interop.elf_import`); and attention in CPU bf16 calls without gradient runs as
two matmuls (:func:`softmax_attention`). Dropout, when set, acts on the attention output and the
SwiGLU hidden state (ELF's ``proj_drop``) in training calls that take gradients; the auxiliary
predictions of Eq. 8 run without gradient and so without dropout, as ELF runs them
(``deterministic=True``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (stable under bf16 autocast), cast back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normed_fp32(x).to(x.dtype)

    def normed_fp32(self, x: torch.Tensor) -> torch.Tensor:
        """The normed values in fp32, for callers that compute on before rounding (qk-norm → RoPE)."""
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)


def rope_tables(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (S, head_dim/2) for integer positions."""
    inv = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, heads, S, head_dim) by the tables (half-split convention), in x's dtype."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[None, None], sin[None, None]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# The most score matrices one softmax_attention group holds at once. Groups of about this size ran
# fastest at 260, 512 and 1,024 positions (bf16, 2-core AMD EPYC, 32 MiB L3): larger groups' scores
# and probabilities leave the cache (at 260 positions groups of 96 matrices ran 2.1x slower than
# groups of 12); one 2,048-position matrix alone exceeds it and is a group of its own.
SCORES_BYTES = 2 * 2**20


def attention_in_matmuls(x: torch.Tensor) -> bool:
    """Whether attention runs as :func:`softmax_attention` instead of SDPA's fused kernel.

    Only for calls without gradient on a CPU under bf16 autocast, outside ``torch.compile``: there
    the fused CPU kernel ran a B-shape denoise call's attention 1.7-1.9x slower than two batched
    matmuls and a softmax (docs/performance.md, a CPU without AMX). The choice depends on
    the device, dtype and mode only, never on the CPU model or the batch, so no machine and no
    batch size changes which numbers a call computes. Training keeps SDPA, whose backward stores
    no score matrix; fp32 keeps it because there the fused kernel was the faster.
    """
    bf16 = x.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                         and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    return (x.device.type == "cpu" and bf16 and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling())


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      scores_bytes: int = SCORES_BYTES) -> torch.Tensor:
    """softmax(q kᵀ) v for (B, heads, S, head_dim) tensors, q already scaled by 1/√head_dim.

    The scores round to q's dtype before the softmax (which computes in fp32 inside); SDPA's
    kernel keeps them in fp32. On B-shape bf16 calls (random weights, batch 1-32) that moved the
    output's error against fp32 from 0.4253-0.4274 % to 0.4265-0.4275 %. The (B·heads) score matrices are made in groups
    of at most ``scores_bytes``, which keeps them in the cache and never holds a long canvas's
    all at once; each matrix is computed alone, so the groups change no value.
    """
    b, h, s, _ = q.shape
    q, k, v = (a.reshape(b * h, s, a.shape[-1]) for a in (q, k, v))
    out = q.new_empty(b * h, s, v.shape[-1])
    group = max(1, scores_bytes // (s * k.shape[1] * q.element_size()))
    for i in range(0, b * h, group):
        j = min(i + group, b * h)
        scores = torch.bmm(q[i:j], k[i:j].transpose(1, 2))
        torch.bmm(torch.softmax(scores, dim=-1), v[i:j], out=out[i:j])
    return out.view(b, h, s, -1)


def _dropout(x: torch.Tensor, p: float, module: nn.Module) -> torch.Tensor:
    """ELF's ``proj_drop``: in training calls that take gradients only."""
    if p > 0 and module.training and torch.is_grad_enabled():
        return F.dropout(x, p=p, training=True)
    return x


class Attention(nn.Module):
    """Bidirectional multi-head attention with qk-norm and RoPE (4·H² weights, 4·H biases)."""

    def __init__(self, width: int, heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.dropout = dropout
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, width, bias=bias)
        self.q_norm = RMSNorm(self.head_dim)
        self.k_norm = RMSNorm(self.head_dim)

    def qkv_heads(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_scale: float = 1.0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (B, heads, S, head_dim); q and k qk-normed and rotated, q times ``q_scale``.

        Norm and RoPE run in fp32 and round once to the compute dtype: under bf16 a rounding
        between them cost two more casts of q and k per block (2-8 % of a B-shape denoise call,
        docs/performance.md) and added error. In fp32 the values are those of norm-then-RoPE
        bit for bit, gradients included (the layout of every tensor is unchanged). ``q_scale``
        scales q's RoPE tables, so it too costs no pass over q and rounds nothing more.
        """
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q_cos, q_sin = (cos, sin) if q_scale == 1.0 else (cos * q_scale, sin * q_scale)
        q = apply_rope(self.q_norm.normed_fp32(q), q_cos, q_sin).to(q.dtype)
        k = apply_rope(self.k_norm.normed_fp32(k), cos, sin).to(k.dtype)
        return q, k, v.to(q.dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``key_mask`` (B, S) bool, True where a position may be attended to (ELF's
        ``attention_mask``); None attends to every position."""
        b, s, _ = x.shape
        if key_mask is None and attention_in_matmuls(x):
            out = softmax_attention(*self.qkv_heads(x, cos, sin, q_scale=self.head_dim ** -0.5))
        else:
            mask = None if key_mask is None else key_mask[:, None, None, :]
            out = F.scaled_dot_product_attention(*self.qkv_heads(x, cos, sin), attn_mask=mask)
        out = self.proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
        return _dropout(out, self.dropout, self)


class SwiGLU(nn.Module):
    """SwiGLU MLP: ``down(silu(gate) · up)`` with gate and up from one projection (3·H·hidden
    weights); ELF's ``SwiGLUFFN`` (``w12``, ``w3``)."""

    def __init__(self, width: int, hidden: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout
        self.gate_up = nn.Linear(width, 2 * hidden, bias=bias)
        self.down = nn.Linear(hidden, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(_dropout(F.silu(gate) * up, self.dropout, self))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int, heads: int, mlp_hidden: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.attn_norm = RMSNorm(width)
        self.attn = Attention(width, heads, bias, dropout)
        self.mlp_norm = RMSNorm(width)
        self.mlp = SwiGLU(width, mlp_hidden, bias, dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, key_mask)
        return x + self.mlp(self.mlp_norm(x))
