"""Frozen causal LMs: the text encoder (clean states x) and the AR teacher (REPA and REG targets).

Both wrap any HF causal LM (hub id + revision, or a local folder). They are frozen three ways:
``eval()``, ``requires_grad_(False)`` and ``torch.no_grad()`` around every call. Blocks above the
deepest layer a wrapper reads are dropped at load time, so an encoder read at layer 20 of a
28-block model costs 20 blocks. Layer k means ``hidden_states[k]`` of HF: the output of block k.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..device import autocast
from .canvas import Canvas
from .tokenizer import hf_source


class ModelUnavailable(RuntimeError):
    """A frozen model could not be loaded (not a local folder, and not in the local HF cache)."""


def load_causal_lm(name_or_path: str, revision: str | None = None, **kwargs) -> PreTrainedModel:
    """Load an HF causal LM (hub id or local folder) and freeze it. A path that does not exist
    fails with ``FileNotFoundError``; any other load failure with :class:`ModelUnavailable`, in
    one line naming the model."""
    # "org/name" may be a hub id or a relative folder; an absolute or ./ path is surely a folder
    if name_or_path.startswith((".", "/", "~")) and not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(errno.ENOENT, "no such model folder", name_or_path)
    try:
        source, extra = hf_source(name_or_path)
        lm = AutoModelForCausalLM.from_pretrained(source, revision=revision, **extra, **kwargs)
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
    """Each token vector standardised by its own feature mean and variance (spec §2)."""
    h = h.float()
    mean = h.mean(dim=-1, keepdim=True)
    var = h.var(dim=-1, keepdim=True, unbiased=False)
    return (h - mean) * torch.rsqrt(var + eps)


class _LayerReader:
    """Runs the bottom blocks of a frozen LM and returns the outputs of chosen blocks."""

    def __init__(self, lm: PreTrainedModel, layers: list[int], bf16: bool = True):
        base = lm.base_model
        blocks = base.layers
        deepest = max(layers)
        if min(layers) < 1 or deepest > len(blocks):
            raise ValueError(f"layer(s) {layers} out of range: the model has {len(blocks)} blocks")
        base.layers = blocks[:deepest]  # blocks above the deepest read layer are never needed
        self.base = freeze(base)
        self.layers = layers
        self.bf16 = bf16
        self.width = int(lm.config.hidden_size)
        self.vocab_size = int(lm.config.vocab_size)
        self._out: dict[int, torch.Tensor] = {}
        self.positions = 0  # rows × length of every read, and rows × length²: what its FLOPs are of
        self.squares = 0
        for k in layers:
            base.layers[k - 1].register_forward_hook(self._hook(k))

    def _hook(self, k: int):
        def store(_module, _inputs, output):
            self._out[k] = output[0] if isinstance(output, tuple) else output
        return store

    @property
    def device(self) -> torch.device:
        return next(self.base.parameters()).device

    @torch.no_grad()
    def read(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        self._out.clear()
        tokens = tokens.to(self.device)
        self.positions += tokens.numel()
        self.squares += tokens.numel() * tokens.shape[-1]
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device).long()
        with autocast(self.device, self.bf16):
            self.base(input_ids=tokens, attention_mask=attention_mask, use_cache=False)
        out = {k: self._out[k].float() for k in self.layers}
        self._out.clear()
        return out


class FrozenEncoder:
    """Clean text states x: layer ``layer`` of the encoder, standardised per token (spec §2)."""

    def __init__(self, lm: PreTrainedModel, layer: int, bf16: bool = True):
        self.reader = _LayerReader(lm, [layer], bf16)
        self.layer = layer
        self.width = self.reader.width
        self.vocab_size = self.reader.vocab_size

    def encode(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) token ids → (B, L, d) float32 standardised states.

        The encoder is causal, so a prompt's states are the same whether it is encoded alone
        (inference) or followed by its answer (training).
        """
        return standardize_tokens(self.reader.read(tokens, attention_mask)[self.layer])


@dataclass
class TeacherTargets:
    """REPA targets h (B, L, D) aligned with canvas positions, the REG target r (B, D) and the
    REPA target at the REG position (B, D)."""

    repa: torch.Tensor
    reg: torch.Tensor
    reg_repa: torch.Tensor


class FrozenTeacher:
    """The AR teacher: sees clean prompt + answer with causal attention, training only (spec §2).

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
