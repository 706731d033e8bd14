"""Transformer parts of the student: RMSNorm, RoPE, qk-normed attention, SwiGLU (ELF conventions)."""

from __future__ import annotations

import math

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


class Attention(nn.Module):
    """Bidirectional multi-head attention with qk-norm and RoPE (4·H² parameters)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.q_norm = RMSNorm(self.head_dim)
        self.k_norm = RMSNorm(self.head_dim)

    def qkv_heads(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (B, heads, S, head_dim); q and k qk-normed and rotated.

        Norm and RoPE run in fp32 and round once to the compute dtype: under bf16 a rounding
        between them cost two more casts of q and k per block (2-8 % of a B-shape denoise call,
        docs/performance.md) and added error. In fp32 the values are those of norm-then-RoPE
        bit for bit, gradients included (the layout of every tensor is unchanged).
        """
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = apply_rope(self.q_norm.normed_fp32(q), cos, sin).to(q.dtype)
        k = apply_rope(self.k_norm.normed_fp32(k), cos, sin).to(k.dtype)
        return q, k, v.to(q.dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        out = F.scaled_dot_product_attention(*self.qkv_heads(x, cos, sin))
        return self.proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    """SwiGLU MLP (3·H·hidden parameters)."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_hidden: int):
        super().__init__()
        self.attn_norm = RMSNorm(width)
        self.attn = Attention(width, heads)
        self.mlp_norm = RMSNorm(width)
        self.mlp = SwiGLU(width, mlp_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class ScalarEmbedder(nn.Module):
    """A scalar condition (t ∈ [0,1] or the SC-CFG scale w) → one conditioning token.

    Sinusoidal features of the raw value with frequencies from 1 to 1000 (so values in [0, 1]
    are resolved finely), then a 2-layer MLP.
    """

    def __init__(self, freq_dim: int, width: int):
        super().__init__()
        half = freq_dim // 2
        self.register_buffer("freqs", torch.exp(torch.linspace(0.0, math.log(1000.0), half)), persistent=False)
        self.mlp = nn.Sequential(nn.Linear(2 * half, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        angles = value.float()[:, None] * self.freqs[None, :]
        return self.mlp(torch.cat([angles.sin(), angles.cos()], dim=-1))
