"""The ELF-REG student: one bidirectional Transformer that denoises and decodes (spec §2).

Sequence layout: ``[t token, w token, mode token, (extra token), content_1 … content_L]``.
Conditioning enters as in-context prefix tokens; RoPE runs over content positions (prefix tokens
sit at position 0, i.e. unrotated). Each content input is ``[z_i ; q_i]`` (noisy state and
self-conditioning, concatenated on channels) projected to the width, plus a prompt/answer
segment embedding.

Denoise mode returns x̂ (zero-initialised head) and, with REG, r̂. Decode mode is the same network
with t = 1 and self-conditioning 0, read out by the decoder head width → encoder width →
vocabulary. The REPA projector p_φ reads block ``repa_block`` and is used in training only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ModelConfig, needs_teacher
from .blocks import Block, RMSNorm, ScalarEmbedder, rope_tables

ExtraToken = Literal["reg", "learned", "none"]


@dataclass
class StudentOutput:
    x_hat: torch.Tensor  # (B, L, d) clean-state prediction; prompt positions restored to the input
    reg_hat: torch.Tensor | None  # (B, d_r) REG prediction r̂
    hidden: torch.Tensor  # (B, L, H) final normed content states (input of both heads)
    repa: torch.Tensor | None  # (B, L + [1 if REG], D_teacher) p_φ(u^(ℓ)); REG position last


# Position of the REG token (or the learned OLT token) in the in-context prefix: after the time,
# SC-CFG scale and decode-mode tokens (the prefix is built in that order in ``forward``).
EXTRA_TOKEN = 3


class Student(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        enc_dim: int,
        vocab_size: int,
        teacher_dim: int | None = None,
        extra_token: ExtraToken = "reg",
        repa: bool = True,
    ):
        super().__init__()
        if needs_teacher(repa, extra_token) and teacher_dim is None:
            raise ValueError("REPA and REG need teacher_dim (the teacher's hidden width)")
        width = cfg.width
        mlp_hidden = cfg.mlp_hidden or (8 * width) // 3
        self.cfg, self.enc_dim, self.vocab_size = cfg, enc_dim, vocab_size
        self.teacher_dim, self.extra_token, self.use_repa = teacher_dim, extra_token, repa

        self.in_proj = nn.Linear(2 * enc_dim, width)
        self.segment = nn.Embedding(2, width)  # 0 prompt, 1 answer
        self.time_embed = ScalarEmbedder(cfg.time_freq_dim, width)
        self.w_embed = ScalarEmbedder(cfg.time_freq_dim, width)
        self.mode_token = nn.Parameter(torch.zeros(width))  # gated by the decode flag
        if extra_token == "reg":
            self.reg_in = nn.Linear(2 * teacher_dim, width)  # [r_t ; REG self-conditioning]
            self.reg_out = nn.Linear(width, teacher_dim)
        elif extra_token == "learned":
            self.learned_token = nn.Parameter(torch.zeros(width))
        self.blocks = nn.ModuleList(Block(width, cfg.heads, mlp_hidden) for _ in range(cfg.depth))
        self.out_norm = RMSNorm(width)
        self.out_x = nn.Linear(width, enc_dim)
        if repa:
            p = cfg.projector_hidden
            self.projector = nn.Sequential(nn.Linear(width, p), nn.SiLU(), nn.Linear(p, p), nn.SiLU(),
                                           nn.Linear(p, teacher_dim))
        self.dec_proj = nn.Linear(width, enc_dim)
        self.vocab_head = nn.Linear(enc_dim, vocab_size, bias=False)
        self.activation_checkpointing = False  # recompute each block in backward (train.activation_checkpointing)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.normal_(self.mode_token, std=0.02)
        if self.extra_token == "learned":
            nn.init.normal_(self.learned_token, std=0.02)
        # zero-initialised output layers: x̂ and r̂ start at 0 (the mean of standardised states)
        for head in [self.out_x] + ([self.reg_out] if self.extra_token == "reg" else []):
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)

    def forward(
        self,
        z: torch.Tensor,
        self_cond: torch.Tensor,
        t: torch.Tensor,
        w: torch.Tensor,
        prompt_mask: torch.Tensor,
        decode: torch.Tensor | None = None,
        reg: torch.Tensor | None = None,
        reg_self_cond: torch.Tensor | None = None,
        want_repa: bool = False,
        drop_reg: bool = False,
        sample_chunks: list[int] | None = None,
    ) -> StudentOutput:
        """One call of the network.

        Args:
            z: (B, L, d) noisy states; prompt positions hold the clean prompt states.
            self_cond: (B, L, d) previous clean prediction q (zeros at the start).
            t: (B,) time in [0, 1] (0 noise, 1 clean). w: (B,) SC-CFG scale.
            prompt_mask: (B, L) bool. decode: (B,) bool; decode rows use t = 1 and q = 0.
            reg, reg_self_cond: (B, d_r) noisy REG state and its previous prediction (REG only).
            drop_reg: run a REG student without its REG token (the sequence is one token shorter
                and ``reg_hat`` is None): "REG removed at inference" of Table 5.
            sample_chunks: run the blocks on chunks of samples of these sizes, in order (the
                prefix tokens, embeddings and heads on the whole batch): the same values, in less cache
                (:mod:`elfreg.model.cache_chunks`).
        """
        b, length, _ = z.shape
        if decode is None:
            decode = torch.zeros(b, dtype=torch.bool, device=z.device)
        t = torch.where(decode, torch.ones_like(t), t)
        keep = (~decode).to(self_cond.dtype)[:, None, None]
        content = self.in_proj(torch.cat([z, self_cond * keep], dim=-1))
        content = content + self.segment((~prompt_mask).long())

        prefix = [self.time_embed(t), self.w_embed(w), decode.to(content.dtype)[:, None] * self.mode_token]
        with_reg = self.extra_token == "reg" and not drop_reg
        if drop_reg and want_repa:
            raise ValueError("REPA reads the REG position; it cannot be asked for with the REG token dropped")
        if with_reg:
            if reg is None:
                raise ValueError("this student has a REG token: pass reg (noise at the start of sampling)")
            rsc = torch.zeros_like(reg) if reg_self_cond is None else reg_self_cond * keep[:, :, 0]
            prefix.append(self.reg_in(torch.cat([reg, rsc], dim=-1)))
        elif self.extra_token == "learned":
            prefix.append(self.learned_token.expand(b, -1))
        n_prefix = len(prefix)
        prefix = torch.stack(prefix, dim=1).to(content.dtype)
        h = torch.cat([prefix, content], dim=1)

        positions = torch.cat([torch.zeros(n_prefix, device=z.device, dtype=torch.long),
                               torch.arange(length, device=z.device)])
        cos, sin = rope_tables(positions, self.cfg.width // self.cfg.heads, self.cfg.rope_base)
        repa_states = None
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        if sample_chunks is not None:
            if want_repa or recompute:
                raise ValueError("sample_chunks is for sampling calls: not with REPA or activation checkpointing")
            if sum(sample_chunks) != b or min(sample_chunks) < 1:
                raise ValueError(f"sample_chunks {sample_chunks} must be positive sizes summing to the batch, {b}")
            h = torch.cat([self._body(part, cos, sin) for part in h.split(sample_chunks)])
        else:
            for i, block in enumerate(self.blocks, start=1):
                h = checkpoint(block, h, cos, sin, use_reentrant=False) if recompute else block(h, cos, sin)
                if want_repa and i == self.cfg.repa_block:
                    repa_states = h
        h = self.out_norm(h)
        hidden = h[:, n_prefix:]
        x_hat = torch.where(prompt_mask[..., None], z, self.out_x(hidden).float())
        reg_hat = self.reg_out(h[:, EXTRA_TOKEN]).float() if with_reg else None
        repa_out = None
        if want_repa:
            if not self.use_repa:
                raise ValueError("this student was built without a REPA projector")
            u = repa_states[:, n_prefix:]
            if self.extra_token == "reg":
                u = torch.cat([u, repa_states[:, EXTRA_TOKEN:EXTRA_TOKEN + 1]], dim=1)
            repa_out = self.projector(u).float()
        return StudentOutput(x_hat=x_hat, reg_hat=reg_hat, hidden=hidden, repa=repa_out)

    def _body(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """All blocks on ``h`` (attention mixes positions within a sample only, so the blocks of
        a chunk of samples compute what they would in the whole batch)."""
        for block in self.blocks:
            h = block(h, cos, sin)
        return h

    def decode_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Decoder head D: width → encoder width → vocabulary logits."""
        return self.vocab_head(self.dec_proj(hidden))

    def parameter_groups(self) -> dict[str, int]:
        """Parameter counts split as in Table 7: non-decoder (incl. training-only parts) / decoder."""
        def count(*mods: nn.Module | None) -> int:
            return sum(p.numel() for m in mods if m is not None for p in m.parameters())

        decoder = count(self.dec_proj, self.vocab_head)
        projector = count(getattr(self, "projector", None))
        total = sum(p.numel() for p in self.parameters())
        return {"non_decoder": total - decoder, "decoder": decoder, "training_only_projector": projector,
                "inference": total - projector, "total": total}
