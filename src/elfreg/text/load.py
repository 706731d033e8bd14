"""Build the frozen side of a run from its :class:`~elfreg.config.TextConfig`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ..config import TextConfig
from ..device import use_bf16
from ..plugins import model_scheme, resolve_model_id
from .canvas import CanvasBuilder
from .frozen import FrozenEncoder, FrozenTeacher, load_causal_lm, load_encoder_lm
from .tokenizer import check_shared_vocabulary, load_tokenizer


@dataclass
class FrozenText:
    tokenizer: PreTrainedTokenizerBase
    canvas: CanvasBuilder
    encoder: FrozenEncoder
    teacher: FrozenTeacher | None


def load_frozen_text(cfg: TextConfig, with_teacher: bool, device: torch.device | str = "cpu",
                     bf16: bool | None = None) -> FrozenText:
    """Tokenizer, canvas builder, encoder and (for REPA/REG training only) the teacher.

    ``bf16`` (autocast of the frozen models) defaults to what ``precision: auto`` picks on
    ``device``, so features match those a default training run saw. Without bf16 the frozen
    weights are fp32 whatever dtype the checkpoint stores: real checkpoints load in their own
    dtype (bf16 for Qwen3), and an fp32 run must not read its features in bf16. With bf16 they
    keep the checkpoint's dtype (half the memory of fp32 for the real models).

    Inference passes ``with_teacher=False``: the teacher is never loaded there. Model ids of the
    form ``toy:encoder`` resolve to the cached toy build (:mod:`elfreg.toy.registry`).
    """
    cfg = resolve_model_ids(cfg)
    if bf16 is None:
        bf16 = use_bf16(torch.device(device), "auto")
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.encoder,
                               cfg.encoder_revision if cfg.tokenizer is None else None)
    weights = None if bf16 else torch.float32
    encoder = FrozenEncoder(load_encoder_lm(cfg.encoder, cfg.encoder_revision).to(device, weights),
                            cfg.encoder_layer, bf16, cfg.standardize, cfg.latent_mean, cfg.latent_std)
    teacher = None
    if with_teacher:
        if not cfg.teacher:
            raise ValueError("text.teacher is not set but REPA/REG need a teacher")
        teacher = FrozenTeacher(load_causal_lm(cfg.teacher, cfg.teacher_revision).to(device, weights),
                                cfg.repa_layer, cfg.reg_layer, cfg.repa_shift, bf16)
    teacher_tok = None
    if teacher is not None and cfg.tokenizer is None and cfg.teacher != cfg.encoder and _has_tokenizer(cfg.teacher):
        teacher_tok = load_tokenizer(cfg.teacher, cfg.teacher_revision)
    check_shared_vocabulary(tokenizer, encoder.vocab_size, teacher.vocab_size if teacher else None, teacher_tok)
    canvas = CanvasBuilder(tokenizer, cfg.canvas_len, cfg.prompt_cap, cfg.prompt_truncation, cfg.answer_cap)
    return FrozenText(tokenizer, canvas, encoder, teacher)


def resolve_model_ids(cfg: TextConfig) -> TextConfig:
    """The config with model ids of a registered scheme (e.g. ``toy:encoder``,
    :mod:`elfreg.plugins`) replaced by their local folders."""
    fields = {k: resolve_model_id(getattr(cfg, k)) for k in ("encoder", "teacher", "tokenizer")
              if model_scheme(getattr(cfg, k))}
    return replace(cfg, **fields) if fields else cfg


def _has_tokenizer(name_or_path: str) -> bool:
    """A local folder without tokenizer files shares the encoder's tokenizer; hub ids have one."""
    folder = Path(name_or_path)
    if not folder.is_dir():
        return True
    return any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
