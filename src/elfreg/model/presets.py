"""Named student presets: the paper's ELF-B/L (ELF's ``ELF_B``/``ELF_L``, sized by
:data:`elfreg.config.MODEL_SIZES`, with and without REPA and REG) and a tiny CPU size."""

from __future__ import annotations

import torch

from ..config import Config, ModelConfig
from .student import Student

QWEN3_VOCAB = 151_936
QWEN3_0_6B_WIDTH = 1024  # frozen encoder (Qwen3-0.6B-Base)
QWEN3_1_7B_WIDTH = 2048  # frozen teacher (Qwen3-1.7B-Base)
# (hidden width, vocabulary) of the paper's frozen models, so counts need no download
KNOWN_FROZEN = {
    "Qwen/Qwen3-0.6B-Base": (QWEN3_0_6B_WIDTH, QWEN3_VOCAB),
    "Qwen/Qwen3-1.7B-Base": (QWEN3_1_7B_WIDTH, QWEN3_VOCAB),
}


PRESETS: dict[str, ModelConfig] = {
    "elf-b": ModelConfig.of_size("elf-b", repa=False, extra_token="none"),
    "elf-reg-b": ModelConfig.of_size("elf-b"),
    "elf-l": ModelConfig.of_size("elf-l", repa=False, extra_token="none"),
    "elf-reg-l": ModelConfig.of_size("elf-l"),
    "tiny": ModelConfig(width=128, depth=4, heads=4, repa_block=2, projector_hidden=256, time_freq_dim=64),
}
"""The paper's students (Table 7): ELF-B/L without REPA and REG, and with them (ELF-REG)."""

# Table 7 of the paper, in parameters: (non-decoder incl. training-only projectors, decoder).
PAPER_COUNTS = {
    "elf-b": (90e6, 156e6),
    "elf-reg-b": (104e6, 156e6),
    "elf-l": (637e6, 157e6),
    "elf-reg-l": (652e6, 157e6),
}


def build_on_meta(name: str, enc_dim: int = QWEN3_0_6B_WIDTH, vocab_size: int = QWEN3_VOCAB,
                  teacher_dim: int = QWEN3_1_7B_WIDTH) -> Student:
    """Build a preset on the meta device: shapes only, no memory, nothing downloaded."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    model = PRESETS[name]
    with torch.device("meta"):
        return Student(model, enc_dim, vocab_size, teacher_dim if model.needs_teacher else None)


def student_from_config(cfg: Config, enc_dim: int, vocab_size: int, teacher_dim: int | None) -> Student:
    """The student a run config describes, sized to its frozen encoder (and teacher); its
    vocabulary is ``model.vocab_size`` when set, else ``vocab_size`` (the encoder's). A run without
    self-conditioning (``flow.sc_prob`` 0) gives a student called without it."""
    return Student(cfg.model, enc_dim, cfg.model.vocab_size or vocab_size, teacher_dim if cfg.needs_teacher else None,
                   self_conditioning=cfg.flow.sc_prob > 0)
