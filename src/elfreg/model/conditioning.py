"""The student's conditioning: learned prefix tokens for the time t, the SC-CFG scale w and the
decode mode, as ELF's network has them (arXiv 2605.10938's code, ``modules/model.py``).

Each condition is a few in-context tokens placed before the content: a learned base per token
(normal(0.02) at init) plus, for t and w, one embedding of the raw value shared by that
condition's tokens. The mode tokens carry no value: they are the learned base times a gate, 1 on
decode rows and 0 on denoise rows (so a denoise call sees zeros there). Prefix tokens are never
rotated by RoPE. Order in the sequence: t tokens, w tokens, mode tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class TimestepEmbedder(nn.Module):
    """A scalar (t ∈ [0, 1] or w) → one width-H vector: ELF's ``TimestepEmbedder``.

    Features ``[cos(v·f_k), sin(v·f_k)]`` of the raw value v with ``freq_dim/2`` frequencies
    f_k = 10000^(−k/(freq_dim/2)), from 1 down to about 1e-4 (a zero is appended when
    ``freq_dim`` is odd), then Linear → SiLU → Linear with normal(0.02) weights and zero biases.
    """

    def __init__(self, width: int, freq_dim: int = 256, max_period: float = 10_000.0):
        super().__init__()
        half = freq_dim // 2
        self.freq_dim = freq_dim
        self.register_buffer("freqs", torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32)
                                                / half), persistent=False)
        self.mlp_in = nn.Linear(freq_dim, width)
        self.mlp_out = nn.Linear(width, width)

    def features(self, value: torch.Tensor) -> torch.Tensor:
        """(B,) values → (B, freq_dim) sinusoidal features (fp32)."""
        args = value.float()[:, None] * self.freqs[None, :]
        feats = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if self.freq_dim % 2:
            feats = torch.cat([feats, torch.zeros_like(feats[:, :1])], dim=-1)
        return feats

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        return self.mlp_out(F.silu(self.mlp_in(self.features(value))))

    def reset_parameters(self) -> None:
        for layer in (self.mlp_in, self.mlp_out):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)


class ConditioningPrefix(nn.Module):
    """The ``time_tokens + cfg_tokens + mode_tokens`` prefix tokens of one call (B, P, H).

    ``cfg_tokens`` or ``mode_tokens`` may be 0 (ELF allows both; a model without SC-CFG tokens
    does not take w as an input); ``time_tokens`` must be at least 1.
    """

    def __init__(self, width: int, time_tokens: int = 4, cfg_tokens: int = 4, mode_tokens: int = 4,
                 freq_dim: int = 256):
        super().__init__()
        if time_tokens < 1 or cfg_tokens < 0 or mode_tokens < 0:
            raise ValueError(f"prefix token counts must be time >= 1, cfg >= 0, mode >= 0; got "
                             f"{time_tokens}, {cfg_tokens}, {mode_tokens}")
        self.time_embedder = TimestepEmbedder(width, freq_dim)
        self.time_tokens = nn.Parameter(torch.empty(1, time_tokens, width))
        self.cfg_embedder = TimestepEmbedder(width, freq_dim) if cfg_tokens else None
        self.cfg_tokens = nn.Parameter(torch.empty(1, cfg_tokens, width)) if cfg_tokens else None
        self.mode_tokens = nn.Parameter(torch.empty(1, mode_tokens, width)) if mode_tokens else None
        self.reset_parameters()

    @property
    def length(self) -> int:
        return sum(p.shape[1] for p in (self.time_tokens, self.cfg_tokens, self.mode_tokens) if p is not None)

    def reset_parameters(self) -> None:
        for tokens in (self.time_tokens, self.cfg_tokens, self.mode_tokens):
            if tokens is not None:
                nn.init.normal_(tokens, std=0.02)
        for embedder in (self.time_embedder, self.cfg_embedder):
            if embedder is not None:
                embedder.reset_parameters()

    def forward(self, t: torch.Tensor, w: torch.Tensor, mode_gate: torch.Tensor) -> torch.Tensor:
        """t, w: (B,) values; ``mode_gate`` (B,) float, 1 on decode rows and 0 on denoise rows."""
        b = t.shape[0]
        parts = [self.time_tokens.expand(b, -1, -1) + self.time_embedder(t)[:, None]]
        if self.cfg_tokens is not None:
            parts.append(self.cfg_tokens.expand(b, -1, -1) + self.cfg_embedder(w)[:, None])
        if self.mode_tokens is not None:
            parts.append(self.mode_tokens.expand(b, -1, -1) * mode_gate.to(self.mode_tokens.dtype)[:, None, None])
        return torch.cat(parts, dim=1)
