"""What a training step costs: model FLOPs per canvas position by component, memory per GPU,
and the throughput a run logs (tokens/s with and without padding, MFU).

FLOPs are 2 per multiply-add, per canvas position of one training example (prompt, answer and
padding alike; the student and the frozen models see the whole canvas). Components:

- ``student_fwd_bwd``: the main pass with gradient (forward + backward = 3 forwards of the
  blocks, the input/output projections and the REPA projector, the projector on the answer
  positions only: it runs where L_REPA reads it, the answer's content tokens, counted here at
  the answer's share of the canvas, an upper bound);
- ``self_cond_aux``: the two auxiliary forwards without gradient of the rows with b = 1, a
  fraction (1 − decode_prob)·sc_prob of the rows (ELF-REG App. A, Eq. 8); in a distillation run
  the frozen teacher's calls instead (:class:`~elfreg.train.build.Objective`);
- ``decoder_head``: width → encoder width → vocabulary on the answer positions of decode rows
  (decode_prob of the rows), forward + backward + the recomputed forward of its checkpointed
  chunks;
- ``frozen_encoder`` / ``frozen_teacher``: forwards of the blocks up to the deepest read layer
  (causal attention counted at half the square);
- ``recompute`` (not counted in MFU): the extra block forward of activation checkpointing.

Attention is counted as 4·S·width per position per block (QKᵀ and AV), S the sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import Config

if TYPE_CHECKING:
    from .build import Run

def prefix_tokens(cfg: Config) -> int:
    """Tokens before the content in every student call: the t, w and mode tokens and, with one,
    the REG or learned token."""
    m = cfg.model
    return m.time_tokens + m.cfg_tokens + m.mode_tokens + (m.extra_token != "none")


@dataclass(frozen=True)
class LMShape:
    """What the cost of a frozen causal LM's forward depends on."""

    width: int
    layers: int  # blocks run (up to the deepest read layer)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of_hf(cls, hf: Any, layers: int) -> LMShape:
        """The shape of an HF config read at ``layers`` blocks (−1: all of them). T5 configs name
        their sizes differently (d_model, d_kv, d_ff); their MLP is counted as a gated one."""
        head_dim = (getattr(hf, "head_dim", None) or getattr(hf, "d_kv", None)
                    or hf.hidden_size // hf.num_attention_heads)
        if layers == -1:
            layers = hf.num_hidden_layers
        return cls(hf.hidden_size, layers, hf.num_attention_heads,
                   getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads, head_dim,
                   getattr(hf, "intermediate_size", None) or hf.d_ff, hf.vocab_size)

    def block_params(self) -> int:
        attn = self.width * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.width * self.intermediate

    def forward_flops(self, seq: int) -> float:
        """Forward FLOPs per position: the matmuls of ``layers`` blocks and causal attention."""
        return self.layers * (2 * self.block_params() + 2 * seq * self.heads * self.head_dim)

    def flops_of(self, positions: float, squares: float) -> float:
        """Forward FLOPs of reads totalling ``positions`` (rows × length) and ``squares``
        (rows × length²): :meth:`forward_flops` summed over them."""
        return self.layers * (2 * self.block_params() * positions + 2 * self.heads * self.head_dim * squares)


# The paper's frozen models (Qwen3 configs), so plans need no download.
QWEN3 = {
    "Qwen/Qwen3-0.6B-Base": dict(width=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=151_936,
                                 total_layers=28),
    "Qwen/Qwen3-1.7B-Base": dict(width=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144, vocab=151_936,
                                 total_layers=28),
}


def frozen_shape(name: str | None, revision: str | None, layers: int) -> LMShape | None:
    """The shape of a frozen model read at ``layers`` blocks: the paper's Qwen3 models offline,
    else its HF config (a local folder, or the local HF cache)."""
    if name is None:
        return None
    if name in QWEN3 and revision is None:
        known = {k: v for k, v in QWEN3[name].items() if k != "total_layers"}
        return LMShape(layers=QWEN3[name]["total_layers"] if layers == -1 else layers, **known)
    from transformers import AutoConfig

    return LMShape.of_hf(AutoConfig.from_pretrained(name, revision=revision), layers)


def frozen_shapes(cfg: Config) -> tuple[LMShape, LMShape | None]:
    """Encoder and (when training needs it) teacher shapes of a run config."""
    from ..text.load import resolve_model_ids

    text = resolve_model_ids(cfg.text)
    encoder = frozen_shape(text.encoder, text.encoder_revision, text.encoder_layer)
    teacher = None
    if cfg.needs_teacher:
        teacher = frozen_shape(text.teacher, text.teacher_revision, max(text.repa_layer, text.reg_layer))
    return encoder, teacher


def flops_per_token(cfg: Config, encoder: LMShape, teacher: LMShape | None,
                    teacher_tokens: int | None = None, aux_forwards: float | None = None) -> dict[str, float]:
    """Model FLOPs per canvas position of one example, by component (see the module docstring);
    ``total`` sums every component but ``recompute``. The teacher runs up to the longest content
    of each micro-batch (``teacher_tokens`` positions per example; default the whole canvas, an
    upper bound). ``aux_forwards``: the student-sized forwards without gradient per example of
    another objective (a distillation's teacher calls); default ELF-REG's self-conditioning ones."""
    m, f, t = cfg.model, cfg.flow, cfg.text
    width, d, vocab = m.width, encoder.width, encoder.vocab
    hidden = m.mlp_hidden or (8 * width) // 3
    seq = t.canvas_len + prefix_tokens(cfg)
    block = 2 * (4 * width * width + 3 * width * hidden) + 4 * seq * width
    # the input path [z ; q] -> d -> bottleneck -> width, and the x-hat head width -> d
    io = 2 * (2 * d * d + d * m.bottleneck + m.bottleneck * width + width * d)
    blocks = m.depth * block
    answer_frac = 1 - t.prompt_cap / (2 * t.canvas_len)  # prompts fill half their cap on average
    projector = 0.0
    if m.repa and teacher is not None:
        p = m.projector_hidden
        projector = 2 * (width * p + p * p + p * teacher.width) * answer_frac
    aux_rows = 2 * (1 - f.decode_prob) * f.sc_prob if aux_forwards is None else aux_forwards
    head = 2 * (width * d + d * vocab)
    out = {
        "student_fwd_bwd": 3 * (blocks + io + projector),
        "self_cond_aux": aux_rows * (blocks + io),
        "decoder_head": 4 * f.decode_prob * answer_frac * head,
        "frozen_encoder": encoder.forward_flops(t.canvas_len),
        "frozen_teacher": 0.0 if teacher is None else (
            teacher.forward_flops(teacher_tokens or t.canvas_len) * (teacher_tokens or t.canvas_len) / t.canvas_len),
    }
    out["total"] = sum(out.values())
    out["recompute"] = blocks if cfg.train.activation_checkpointing else 0.0
    return out


class Throughput:
    """Running tokens/s (with and without padding) and MFU of a training loop."""

    def __init__(self, flops: dict[str, float] | None, world: int, peak_tflops: float, device: Any = None,
                 frozen: tuple[LMShape, LMShape | None] | None = None):
        self.flops, self.world, self.peak, self.device, self.frozen = flops, world, peak_tflops, device, frozen
        self.tokens = self.real = self.steps = 0
        self.seconds = 0.0
        self.reads = [0.0, 0.0, 0.0, 0.0]  # encoder positions, squares, teacher positions, squares

    @classmethod
    def of_run(cls, run: Run) -> Throughput:
        enc = run.frozen.encoder.reader.base.config
        encoder = LMShape.of_hf(enc, run.cfg.text.encoder_layer)
        teacher = None
        if run.with_teacher:
            tc = run.cfg.text
            teacher = LMShape.of_hf(run.frozen.teacher.reader.base.config, max(tc.repa_layer, tc.reg_layer))
        aux = run.objective.aux_forwards if run.objective is not None else None
        flops = flops_per_token(run.cfg, encoder, teacher, aux_forwards=aux)
        return cls(flops, run.dist.world, run.cfg.train.peak_tflops, run.device, (encoder, teacher))

    def add(self, tokens: int, real_tokens: int, seconds: float, reads: list[float] | None = None) -> None:
        """One step: canvas tokens with and without padding, its time, and the frozen models'
        reads (encoder positions and squares, teacher positions and squares; all ranks)."""
        self.tokens += tokens
        self.real += real_tokens
        self.seconds += seconds
        self.steps += 1
        for i, value in enumerate(reads or []):
            self.reads[i] += value

    def _measured(self) -> dict[str, float] | None:
        """FLOPs per canvas token with the frozen models counted as they ran (the teacher up to
        each batch's content, nothing for examples the feature cache served)."""
        if self.flops is None or self.frozen is None or not self.tokens:
            return self.flops
        encoder, teacher = self.frozen
        out = dict(self.flops)
        out["frozen_encoder"] = encoder.flops_of(*self.reads[:2]) / self.tokens
        out["frozen_teacher"] = teacher.flops_of(*self.reads[2:]) / self.tokens if teacher is not None else 0.0
        out["total"] = sum(v for k, v in out.items() if k not in ("total", "recompute"))
        return out

    def report(self) -> dict[str, float]:
        """tokens/s, real (unpadded) tokens/s, seconds per step, model TFLOP/s per device, MFU,
        FLOPs per token by component (averaged since the loop started), and on CUDA the peak
        memory allocated on this rank's GPU."""
        secs = max(self.seconds, 1e-9)
        out = {"tokens_per_s": self.tokens / secs, "real_tokens_per_s": self.real / secs,
               "step_seconds": secs / max(self.steps, 1)}
        if self.device is not None and getattr(self.device, "type", None) == "cuda":
            import torch

            out["peak_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        flops = self._measured()
        if flops is not None:
            tflops = self.tokens * flops["total"] / secs / self.world / 1e12
            out["tflops_per_device"] = tflops
            out["mfu"] = tflops / self.peak if self.peak > 0 else 0.0
            out.update({f"flops_per_token.{k}": v for k, v in flops.items()})
        return out


def memory_per_gpu(cfg: Config, params: dict[str, int], encoder: LMShape, teacher: LMShape | None,
                   gpus: int, frozen_bytes: int = 2) -> dict[str, float]:
    """Bytes per GPU of a training run by part. ``params``: ``total`` student parameters and
    ``muon`` (those Muon updates). Weights, gradients, EMA and optimiser state are fp32 (divided
    over the GPUs under ``fsdp2``); activations are those the main pass keeps for its backward at
    the canvas length for this GPU's share of the micro-batch (bf16 under bf16 precision; one
    block's input per block with activation checkpointing); the decoder head's logits are those
    of one chunk (at most 8192 of the expected decode positions), recomputed in the backward
    pass (bf16 logits, their fp32 copy and gradient); frozen models are counted at
    ``frozen_bytes`` per weight (their checkpoints' bf16), divided over the GPUs with
    ``text.shard_frozen``."""
    tc, m, t = cfg.train, cfg.model, cfg.text
    shard = gpus if tc.parallel == "fsdp2" else 1
    total, muon = params["total"], params.get("muon", 0) if tc.optimizer == "muon" else 0
    act_bytes = 2 if tc.precision != "fp32" else 4
    width = m.width
    hidden = m.mlp_hidden or (8 * width) // 3
    seq = t.canvas_len + prefix_tokens(cfg)
    per_block = seq * ((10 * width + 4 * hidden) * act_bytes + 8 * width)  # + fp32 RMSNorm inputs
    if tc.activation_checkpointing:
        blocks = seq * width * act_bytes * m.depth + per_block
    else:
        blocks = per_block * m.depth
    examples = tc.batch_size / gpus
    # answer positions of this GPU's decode rows (decode_prob of the rows), the decoder head's input
    decode_positions = cfg.flow.decode_prob * examples * (t.canvas_len - t.prompt_cap / 2)
    frozen_params = encoder.layers * encoder.block_params() + encoder.width * encoder.vocab
    if teacher is not None:
        frozen_params += teacher.layers * teacher.block_params() + teacher.width * teacher.vocab
    out = {
        "weights": 4 * total / shard,
        "gradients": 4 * total / shard,
        "optimizer": (8 * (total - muon) + 4 * muon) / shard,
        "ema": 4 * total / shard,
        "activations": examples * blocks,
        "decoder_logits_chunk": min(8192, decode_positions) * encoder.vocab * (2 + 4 + 4),
        "frozen_models": frozen_bytes * frozen_params / (gpus if t.shard_frozen else 1),
    }
    out["total"] = sum(out.values())
    return out
