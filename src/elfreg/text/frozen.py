"""Frozen text models: the text encoder (clean states x) and the AR teacher (REPA and REG targets).

The encoder is any HF causal LM, read at the output of one of its blocks (ELF-REG's Qwen3-0.6B-Base
at block 20), or a T5 encoder read at its output (ELF's ``t5-small`` …). The teacher is a causal
LM. Either is a hub id + revision or a local folder. They are frozen three ways: ``eval()``,
``requires_grad_(False)`` and ``torch.no_grad()`` around every call. Blocks above the deepest
layer a causal wrapper reads are dropped at load time, so an encoder read at layer 20 of a
28-block model costs 20 blocks. Layer k means ``hidden_states[k]`` of HF: the output of block k;
layer −1 means the model's final output (``last_hidden_state``, after its final norm).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, T5EncoderModel

from ..device import autocast
from .canvas import Canvas
from .tokenizer import hf_source

T5_TYPES = ("t5", "mt5", "umt5")
Standardize = Literal["token", "global"]


class ModelUnavailable(RuntimeError):
    """A frozen model could not be loaded (not a local folder, and not in the local HF cache)."""


def load_causal_lm(name_or_path: str, revision: str | None = None, **kwargs) -> PreTrainedModel:
    """Load an HF causal LM (hub id or local folder) and freeze it. A path that does not exist
    fails with ``FileNotFoundError``; any other load failure with :class:`ModelUnavailable`, in
    one line naming the model."""
    return _load(AutoModelForCausalLM, name_or_path, revision, **kwargs)


def load_encoder_lm(name_or_path: str, revision: str | None = None, **kwargs) -> PreTrainedModel:
    """The frozen encoder model: a ``T5EncoderModel`` when the model's config is a T5 one
    (``model_type`` t5, mt5 or umt5; ELF's encoders), else a causal LM (:func:`load_causal_lm`)."""
    try:
        source, extra = hf_source(name_or_path)
        model_type = getattr(AutoConfig.from_pretrained(source, revision=revision, **extra), "model_type", "")
    except (OSError, ValueError):
        model_type = ""  # a missing or unloadable model: the loader below says so in one line
    return _load(T5EncoderModel if model_type in T5_TYPES else AutoModelForCausalLM, name_or_path, revision,
                 **kwargs)


def _load(cls, name_or_path: str, revision: str | None, **kwargs) -> PreTrainedModel:
    # "org/name" may be a hub id or a relative folder; an absolute or ./ path is surely a folder
    if name_or_path.startswith((".", "/", "~")) and not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(errno.ENOENT, "no such model folder", name_or_path)
    try:
        source, extra = hf_source(name_or_path)
        lm = cls.from_pretrained(source, revision=revision, **extra, **kwargs)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelUnavailable(f"cannot load model {name_or_path!r}: {first}") from err
    return freeze(lm)


def freeze(module: nn.Module) -> nn.Module:
    """``module`` in eval mode (no dropout, fixed norms) with no parameter asking for a gradient;
    the same object, returned for chaining. Calls still belong under ``torch.no_grad()``."""
    module.eval()
    module.requires_grad_(False)
    return module


def standardize_tokens(h: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each token vector standardised by its own feature mean and variance (ELF-REG, arXiv
    2609.29102 §3.1)."""
    h = h.float()
    mean = h.mean(dim=-1, keepdim=True)
    var = h.var(dim=-1, keepdim=True, unbiased=False)
    return (h - mean) * torch.rsqrt(var + eps)


def is_t5(model: PreTrainedModel) -> bool:
    return getattr(model.config, "model_type", "") in T5_TYPES


def t5_attention_mask(canvas: Canvas) -> torch.Tensor:
    """ELF's encoder mask for a bidirectional encoder (B, 1, L, L), True = may attend: prompt
    positions attend to the prompt only, every other position to the prompt and the answer's
    tokens, special ones (an EOS inside the answer) included, but not to the EOS padding after
    them (ELF's ``is_valid``: positions before the sequence's length). So prompt states do not
    depend on the answer, as with a causal encoder. A row with nothing to attend to (an empty
    prompt and answer) attends to itself."""
    pos = torch.arange(canvas.tokens.shape[1], device=canvas.tokens.device)
    valid = pos[None, :] < canvas.lengths.to(pos.device)[:, None]
    prompt = canvas.prompt_mask
    mask = (prompt[:, :, None] & prompt[:, None, :]) | (~prompt[:, :, None] & valid[:, None, :])
    lone = ~mask.any(-1)
    mask |= lone[:, :, None] & torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
    return mask[:, None]


class _LayerReader:
    """Runs the bottom blocks of a frozen causal LM (or a T5 encoder: all of it) and returns the
    outputs of chosen layers (−1: the final output)."""

    def __init__(self, lm: PreTrainedModel, layers: list[int], bf16: bool = True):
        self.t5 = is_t5(lm)
        base = lm if self.t5 else lm.base_model
        blocks = base.encoder.block if self.t5 else base.layers
        if self.t5 and layers != [-1]:
            raise ValueError(f"a T5 encoder is read at its output (layer -1, as ELF reads it), "
                             f"not at layer(s) {layers}")
        block_layers = [k for k in layers if k != -1]
        if any(k < 1 or k > len(blocks) for k in block_layers):
            raise ValueError(f"layer(s) {layers} out of range: the model has {len(blocks)} blocks (or -1: its output)")
        if block_layers and -1 not in layers:
            base.layers = blocks[:max(block_layers)]  # blocks above the deepest read layer are never needed
        self.base = freeze(base)
        self.layers = layers
        self.bf16 = bf16
        config = lm.config
        self.width = int(getattr(config, "d_model", None) or config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        self._out: dict[int, torch.Tensor] = {}
        self.positions = 0  # rows × length of every read, and rows × length²: what its FLOPs are of
        self.squares = 0
        for k in block_layers:
            base.layers[k - 1].register_forward_hook(self._hook(k))

    @property
    def blocks(self) -> nn.ModuleList:
        """The blocks the reader runs (what ``text.shard_frozen`` shards)."""
        return self.base.encoder.block if self.t5 else self.base.layers

    def _hook(self, k: int):
        def store(_module, _inputs, output):
            self._out[k] = output[0] if isinstance(output, tuple) else output
        return store

    @property
    def device(self) -> torch.device:
        return next(self.base.parameters()).device

    @torch.no_grad()
    def read(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        """Layer outputs (float32) for token rows (B, L); ``attention_mask`` is (B, L) padding or
        (B, 1, L, L) boolean."""
        self._out.clear()
        tokens = tokens.to(self.device)
        self.positions += tokens.numel()
        self.squares += tokens.numel() * tokens.shape[-1]
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
            if attention_mask.dim() == 2:
                attention_mask = attention_mask.long()
        with autocast(self.device, self.bf16):
            out = self.base(input_ids=tokens, attention_mask=attention_mask, use_cache=False) if not self.t5 \
                else self.base(input_ids=tokens, attention_mask=attention_mask)
        if -1 in self.layers:
            self._out[-1] = out.last_hidden_state
        states = {k: self._out[k].float() for k in self.layers}
        self._out.clear()
        return states


class FrozenEncoder:
    """Clean text states x: layer ``layer`` of the encoder, standardised per token (ELF-REG's
    choice, arXiv 2609.29102 §3.1) or globally, ``(h − latent_mean)/latent_std`` (ELF's)."""

    def __init__(self, lm: PreTrainedModel, layer: int, bf16: bool = True, standardize: Standardize = "token",
                 latent_mean: float = 0.0, latent_std: float = 1.0):
        if standardize not in ("token", "global"):
            raise ValueError(f"standardize must be token or global, got {standardize!r}")
        if standardize == "global" and not latent_std > 0:
            raise ValueError(f"latent_std must be > 0, got {latent_std}")
        self.reader = _LayerReader(lm, [layer], bf16)
        self.layer = layer
        self.width = self.reader.width
        self.vocab_size = self.reader.vocab_size
        self.standardize, self.latent_mean, self.latent_std = standardize, latent_mean, latent_std

    @property
    def bidirectional(self) -> bool:
        """Whether the encoder is a T5 encoder (its masks come from the canvas, :meth:`encode_canvas`)."""
        return self.reader.t5

    def _standardized(self, h: torch.Tensor) -> torch.Tensor:
        if self.standardize == "token":
            return standardize_tokens(h)
        return (h.float() - self.latent_mean) / self.latent_std

    def encode(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) token ids → (B, L, d) float32 standardised states, every position seeing what the
        model's own attention lets it (all of a bidirectional encoder's row)."""
        return self._standardized(self.reader.read(tokens, attention_mask)[self.layer])

    def encode_canvas(self, canvas: Canvas) -> torch.Tensor:
        """The states x of a canvas (B, L, d). Prompt states do not depend on the answer region:
        a causal encoder cannot look ahead, and a T5 encoder gets ELF's mask
        (:func:`t5_attention_mask`), so a prompt's states at inference (EOS placeholders after it)
        are those training saw."""
        return self.encode(canvas.tokens, t5_attention_mask(canvas) if self.bidirectional else None)


@dataclass
class TeacherTargets:
    """REPA targets h (B, L, D) aligned with canvas positions, the REG target r (B, D) and the
    REPA target at the REG position (B, D)."""

    repa: torch.Tensor
    reg: torch.Tensor
    reg_repa: torch.Tensor


class FrozenTeacher:
    """The AR teacher: sees clean prompt + answer with causal attention, training only (ELF-REG §3, App. A.1).

    REG targets are standardised per feature with statistics set by :meth:`calibrate` (estimated
    once from teacher states of training examples before training, and saved with the run so a
    resumed run uses the same ones).
    """

    def __init__(self, lm: PreTrainedModel, repa_layer: int, reg_layer: int, shift: int = 0,
                 bf16: bool = True):
        if shift not in (0, 1):
            raise ValueError(f"repa shift must be 0 or 1, got {shift}")
        self.reader = _LayerReader(lm, sorted({repa_layer, reg_layer}), bf16)
        self.repa_layer, self.reg_layer, self.shift = repa_layer, reg_layer, shift
        self.width = self.reader.width
        self.vocab_size = self.reader.vocab_size
        self.reg_mean = torch.zeros(self.width)
        self.reg_std = torch.ones(self.width)

    def _raw(self, canvas: Canvas) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Targets are read at content positions and the last content token only, and the teacher
        # is causal, so it runs up to the longest content of the batch: the EOS padding after it
        # (most of a 1024-token canvas for short answers) would change no target. The padding
        # positions' REPA targets are zeros (never read: REPA averages over content tokens).
        length = canvas.tokens.shape[1]
        used = int(canvas.last_content.max()) + 1
        states = self.reader.read(canvas.tokens[:, :used])
        repa_states = torch.nn.functional.pad(states[self.repa_layer], (0, 0, 0, length - used))
        rows = torch.arange(canvas.tokens.shape[0], device=repa_states.device)
        last = canvas.last_content.to(repa_states.device)
        reg = states[self.reg_layer][rows, last]
        reg_repa = repa_states[rows, last]
        if self.shift == 1:  # position i is aligned with teacher position i-1
            repa_states = torch.cat([repa_states[:, :1], repa_states[:, :-1]], dim=1)
        return repa_states, reg, reg_repa

    def calibrate(self, canvases: list[Canvas]) -> None:
        """Set the per-feature mean and std of the REG target from a few training canvases."""
        regs = torch.cat([self._raw(c)[1] for c in canvases])
        if regs.shape[0] < 2:
            raise ValueError("REG calibration needs at least two examples")
        self.reg_mean = regs.mean(0).cpu()
        self.reg_std = regs.std(0).clamp(min=1e-4).cpu()

    def targets(self, canvas: Canvas) -> TeacherTargets:
        repa, reg, reg_repa = self._raw(canvas)
        reg = (reg - self.reg_mean.to(reg.device)) / self.reg_std.to(reg.device)
        return TeacherTargets(repa=repa, reg=reg, reg_repa=reg_repa)
