"""The ELF-REG student: ELF's network (one bidirectional Transformer that denoises and decodes)
with ELF-REG's REPA projector and REG token (arXiv 2609.29102 §3; ELF, arXiv 2605.10938).

Sequence layout: ``[t tokens, w tokens, mode tokens, (REG or learned token), content_1 … content_L]``.
The prefix tokens (:mod:`elfreg.model.conditioning`) and the extra token are never rotated by
RoPE; content positions are rotated by their index 0 … L−1.

Input path (ELF's, in fp32): each content input ``[z_i ; q_i]`` (noisy state and
self-conditioning, concatenated on channels) → ``self_cond_proj`` (2d → d, with bias) →
bottleneck d → 128 (no bias) → width (with bias). Output heads (in fp32): x̂ = Linear(RMSNorm(h))
with a zero-initialised Linear (ELF's ``FinalLayer``); REG's r̂ the same with its own head; the
decoder D = ``W2·gelu_tanh(W1·h + b1) + b2`` on the block output *before* any final norm, width →
encoder width → vocabulary. The blocks run in the compute dtype (bf16 under autocast) on an fp32
residual stream, as ELF's do.

One call is four stages, each a method: :meth:`Student.embed` (input path and prefix tokens),
:meth:`Student.run_blocks`, :meth:`Student.heads` (x̂, r̂ and the decoder head's input) and
:meth:`Student.repa_projection` (training only); :meth:`Student.forward` runs them in order.
Inference paths that run the stages otherwise (the blocks on cache-sized chunks of samples) live
with the sampling network (:mod:`elfreg.sampling.network`).

The network is a function of its inputs only: the caller sets what a mode means (decode calls pass
t = 1 and q = 0, :mod:`elfreg.flow.objective` and :mod:`elfreg.sampling.network`); ``decode`` is
the mode tokens' gate. Its shape is ``model.*`` of the run config (the REPA projector and the extra
token with the rest). Initialisation as ELF's: Linear weights xavier-uniform and biases zero,
the t/w embedders' weights normal(0.02), learned tokens normal(0.02), the x̂ and r̂ output layers
zero. The REPA projector p_φ reads block ``repa_block`` and is used in training only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ExtraToken, ModelConfig
from .blocks import Block, RMSNorm, rope_tables
from .conditioning import ConditioningPrefix

# The parameter layout checkpoints are written in: 2 is ELF's network (elfreg 0.2); 1 was elfreg
# 0.1's own student (one input Linear, one token per condition, a linear decoder head), which this
# version cannot read.
STUDENT_FORMAT = 2

__all__ = ["STUDENT_FORMAT", "Embedded", "ExtraToken", "OutputHead", "Student", "StudentOutput", "fp32"]


@dataclass
class StudentOutput:
    x_hat: torch.Tensor  # (B, L, d) clean-state prediction (fp32); prompt positions restored to the input
    reg_hat: torch.Tensor | None  # (B, d_r) REG prediction r̂ (fp32)
    hidden: torch.Tensor  # (B, L, H) block output at content positions (the decoder head's input)
    repa: torch.Tensor | None  # (B, L + [1 if REG], D_teacher) p_φ(u^(ℓ)); REG position last


@dataclass
class Embedded:
    """One call's sequence before the blocks: prefix tokens then content, (B, P + L, H) in fp32,
    with the RoPE tables of its positions and the keys it may attend to."""

    h: torch.Tensor
    n_prefix: int
    with_reg: bool  # the REG token is the last prefix token
    cos: torch.Tensor
    sin: torch.Tensor
    key_mask: torch.Tensor | None  # (B, P + L) bool, or None: every position


class OutputHead(nn.Module):
    """RMSNorm then a zero-initialised Linear (ELF's ``FinalLayer``): predictions start at 0, the
    mean of standardised states."""

    def __init__(self, width: int, out_dim: int):
        super().__init__()
        self.norm = RMSNorm(width)
        self.linear = nn.Linear(width, out_dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(h))


def fp32(device: torch.device):
    """A region where autocast is off on ``device`` (ELF's input path and heads run in fp32)."""
    return torch.autocast(device.type, enabled=False)


class Student(nn.Module):
    """The network ``cfg`` describes (:class:`~elfreg.config.ModelConfig`, its REPA projector and
    extra token included), for an encoder of width ``enc_dim``, a decoder of ``vocab_size``
    tokens and, when REPA or REG is on, a teacher of width ``teacher_dim``. A student built with
    ``self_conditioning=False`` (a run with ``flow.sc_prob`` 0) is called without a
    self-conditioning input; that changes no parameter."""

    def __init__(self, cfg: ModelConfig, enc_dim: int, vocab_size: int, teacher_dim: int | None = None,
                 self_conditioning: bool = True):
        super().__init__()
        if cfg.needs_teacher and teacher_dim is None:
            raise ValueError("REPA and REG need teacher_dim (the teacher's hidden width)")
        width = cfg.width
        mlp_hidden = cfg.mlp_hidden or (8 * width) // 3
        self.cfg, self.enc_dim, self.vocab_size, self.teacher_dim = cfg, enc_dim, vocab_size, teacher_dim
        # whether callers pass a self-conditioning input (a run trained with flow.sc_prob 0 never
        # does: z alone enters the bottleneck, ELF's path for such a model)
        self.self_conditioning = self_conditioning

        self.self_cond_proj = nn.Linear(2 * enc_dim, enc_dim)
        self.text_down = nn.Linear(enc_dim, cfg.bottleneck, bias=False)
        self.text_up = nn.Linear(cfg.bottleneck, width)
        self.prefix = ConditioningPrefix(width, cfg.time_tokens, cfg.cfg_tokens, cfg.mode_tokens, cfg.time_freq_dim)
        if cfg.extra_token == "reg":
            self.reg_in = nn.Linear(2 * teacher_dim, width)  # [r_t ; REG self-conditioning]
            self.reg_head = OutputHead(width, teacher_dim)
        elif cfg.extra_token == "learned":
            self.learned_token = nn.Parameter(torch.empty(width))
        # dropout, when set, in the middle half of the blocks (ELF: blocks depth//4 … 3·depth//4 − 1)
        first, last = cfg.depth // 4, cfg.depth // 4 * 3
        self.blocks = nn.ModuleList(
            Block(width, cfg.heads, mlp_hidden, cfg.bias, cfg.dropout if first <= i < last else 0.0)
            for i in range(cfg.depth))
        self.final_layer = OutputHead(width, enc_dim)
        if cfg.repa:
            p = cfg.projector_hidden
            self.projector = nn.Sequential(nn.Linear(width, p), nn.SiLU(), nn.Linear(p, p), nn.SiLU(),
                                           nn.Linear(p, teacher_dim))
        self.dec_proj = nn.Linear(width, enc_dim)
        self.vocab_head = nn.Linear(enc_dim, vocab_size)
        self.activation_checkpointing = False  # recompute each block in backward (train.activation_checkpointing)
        self.reset_parameters()

    @property
    def extra_token(self) -> ExtraToken:
        return self.cfg.extra_token

    @property
    def use_repa(self) -> bool:
        return self.cfg.repa

    @property
    def n_prefix(self) -> int:
        """Tokens before the content: the conditioning prefix and, with one, the extra token."""
        return self.prefix.length + (self.extra_token != "none")

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.prefix.reset_parameters()
        if self.extra_token == "learned":
            nn.init.normal_(self.learned_token, std=0.02)
        for head in [self.final_layer] + ([self.reg_head] if self.extra_token == "reg" else []):
            nn.init.zeros_(head.linear.weight)
            nn.init.zeros_(head.linear.bias)

    def forward(
        self,
        z: torch.Tensor,
        self_cond: torch.Tensor | None,
        t: torch.Tensor,
        w: torch.Tensor,
        prompt_mask: torch.Tensor,
        decode: torch.Tensor | None = None,
        reg: torch.Tensor | None = None,
        reg_self_cond: torch.Tensor | None = None,
        want_repa: bool = False,
        repa_positions: torch.Tensor | None = None,
        drop_reg: bool = False,
        attention_mask: torch.Tensor | None = None,
    ) -> StudentOutput:
        """One call of the network: :meth:`embed` → :meth:`run_blocks` → :meth:`heads` (→
        :meth:`repa_projection` with ``want_repa``).

        Args:
            z: (B, L, d) noisy states; prompt positions hold the clean prompt states.
            self_cond: (B, L, d) self-conditioning input q (the previous clean prediction; the
                clean prompt at prompt positions; zeros in decode calls). None: ``z`` alone enters
                the bottleneck, bypassing ``self_cond_proj`` (ELF's path for an input of width d).
            t: (B,) time in [0, 1] (0 noise, 1 clean; decode calls pass 1). w: (B,) SC-CFG scale.
            prompt_mask: (B, L) bool: x̂ at these positions is ``z`` (the clean prompt).
            decode: (B,) bool or 0/1 float, the mode tokens' gate (None: 0, a denoise call).
            reg, reg_self_cond: (B, d_r) noisy REG state and its previous prediction (REG only).
            want_repa: also return the REPA projection p_φ(u) of block ``repa_block``'s states
                (ELF-REG §3.2): (B, L, D) at every content position, then (with REG) the REG
                position's, (B, L + 1, D).
            repa_positions: (B, L) or, with REG, (B, L + 1) bool, with ``want_repa``: project only
                these positions; ``repa`` is then (N, D), the N chosen positions in row-major
                order. Training asks for the positions L_REPA averages over
                (:func:`~elfreg.flow.objective.repa_mask`): the projector runs on an answer's
                positions, not on its prompt and padding, whose projections L_REPA never reads.
            drop_reg: run a REG student without its REG token (the sequence is one token shorter
                and ``reg_hat`` is None): "REG removed at inference" of Table 5.
            attention_mask: (B, L) content positions that may be attended to (1/True), as ELF's
                ``attention_mask``; prefix tokens always may. None: every position.
        """
        if drop_reg and want_repa:
            raise ValueError("REPA reads the REG position; it cannot be asked for with the REG token dropped")
        if repa_positions is not None and not want_repa:
            raise ValueError("repa_positions says where to project: it needs want_repa=True")
        seq = self.embed(z, self_cond, t, w, decode, reg, reg_self_cond, drop_reg, attention_mask)
        h, kept = self.run_blocks(seq.h, seq.cos, seq.sin, seq.key_mask,
                                  keep=self.cfg.repa_block if want_repa else None)
        x_hat, reg_hat, hidden = self.heads(h, seq, z, prompt_mask)
        repa = self.repa_projection(kept, seq, repa_positions) if want_repa else None
        return StudentOutput(x_hat=x_hat, reg_hat=reg_hat, hidden=hidden, repa=repa)

    def embed(self, z: torch.Tensor, self_cond: torch.Tensor | None, t: torch.Tensor, w: torch.Tensor,
              decode: torch.Tensor | None = None, reg: torch.Tensor | None = None,
              reg_self_cond: torch.Tensor | None = None, drop_reg: bool = False,
              attention_mask: torch.Tensor | None = None) -> Embedded:
        """The sequence the blocks read (fp32, outside autocast, as ELF's input path): the prefix
        tokens of t, w and the mode gate, the extra token, then each content input through the
        input path. Arguments as :meth:`forward`'s."""
        b, length, _ = z.shape
        gate = torch.zeros(b, device=z.device) if decode is None else decode.float()
        with_reg = self.extra_token == "reg" and not drop_reg
        if with_reg and reg is None:
            raise ValueError("this student has a REG token: pass reg (noise at the start of sampling)")
        with fp32(z.device):
            inputs = z.float() if self_cond is None else self.self_cond_proj(torch.cat([z, self_cond], dim=-1).float())
            content = self.text_up(self.text_down(inputs))
            parts = [self.prefix(t.float(), w.float(), gate)]
            if with_reg:
                rsc = torch.zeros_like(reg) if reg_self_cond is None else reg_self_cond
                parts.append(self.reg_in(torch.cat([reg, rsc], dim=-1).float())[:, None])
            elif self.extra_token == "learned":
                parts.append(self.learned_token.float().expand(b, 1, -1))
            prefix = torch.cat(parts, dim=1)
        n_prefix = prefix.shape[1]
        positions = torch.cat([torch.zeros(n_prefix, device=z.device, dtype=torch.long),
                               torch.arange(length, device=z.device)])
        cos, sin = rope_tables(positions, self.cfg.width // self.cfg.heads, self.cfg.rope_base)
        key_mask = None
        if attention_mask is not None:
            key_mask = torch.cat([torch.ones(b, n_prefix, dtype=torch.bool, device=z.device),
                                  attention_mask.to(z.device).bool()], dim=1)
        return Embedded(torch.cat([prefix, content], dim=1), n_prefix, with_reg, cos, sin, key_mask)

    def run_blocks(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_mask: torch.Tensor | None = None,
                   keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every block on ``h``; with ``keep`` = k also the output of block k (1-based: REPA's
        u^(ℓ)). Each block is recomputed in backward under ``activation_checkpointing``.
        Attention mixes positions within a sample only, so the blocks of a chunk of samples
        compute what they would in the whole batch."""
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        kept = None
        for i, block in enumerate(self.blocks, start=1):
            if recompute:
                h = checkpoint(block, h, cos, sin, key_mask, use_reentrant=False)
            else:
                h = block(h, cos, sin, key_mask)
            if i == keep:
                kept = h
        return h, kept

    def heads(self, h: torch.Tensor, seq: Embedded, z: torch.Tensor, prompt_mask: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(x̂, r̂, hidden) of the blocks' output ``h`` (fp32): x̂ with the prompt positions of ``z``
        kept, r̂ at the REG position (None without it), and the content positions' states, the
        decoder head's input (:meth:`decode_logits`)."""
        hidden = h[:, seq.n_prefix:]
        with fp32(z.device):
            x_hat = torch.where(prompt_mask[..., None], z.float(), self.final_layer(hidden.float()))
            reg_hat = self.reg_head(h[:, seq.n_prefix - 1].float()) if seq.with_reg else None
        return x_hat, reg_hat, hidden

    def repa_projection(self, u: torch.Tensor, seq: Embedded, positions: torch.Tensor | None = None) -> torch.Tensor:
        """p_φ(u^(ℓ)) (fp32) of block ``repa_block``'s states ``u`` at the content positions, then the
        REG position's, or at ``positions`` only (see :meth:`forward`'s ``repa_positions``)."""
        if not self.use_repa:
            raise ValueError("this student was built without a REPA projector")
        content = u[:, seq.n_prefix:]
        if self.extra_token == "reg":
            content = torch.cat([content, u[:, seq.n_prefix - 1:seq.n_prefix]], dim=1)
        if positions is not None:
            if positions.shape != content.shape[:2]:
                raise ValueError(f"repa_positions has shape {tuple(positions.shape)}, the projected "
                                 f"positions {tuple(content.shape[:2])}")
            content = content[positions]
        return self.projector(content).float()

    def decode_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Decoder head D (fp32): ``vocab_head(gelu_tanh(dec_proj(h)))``, width → encoder width →
        vocabulary logits, on block outputs ``hidden`` (…, H)."""
        with fp32(hidden.device):
            return self.vocab_head(F.gelu(self.dec_proj(hidden.float()), approximate="tanh"))

    def parameter_groups(self) -> dict[str, int]:
        """Parameter counts split as in Table 7: non-decoder (incl. training-only parts) / decoder."""
        def count(*mods: nn.Module | None) -> int:
            return sum(p.numel() for m in mods if m is not None for p in m.parameters())

        decoder = count(self.dec_proj, self.vocab_head)
        projector = count(getattr(self, "projector", None))
        total = sum(p.numel() for p in self.parameters())
        return {"non_decoder": total - decoder, "decoder": decoder, "training_only_projector": projector,
                "inference": total - projector, "total": total}
