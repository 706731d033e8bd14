"""The one tokenizer shared by encoder, teacher and the decoder vocabulary."""

from __future__ import annotations

import errno
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def hf_source(name_or_path: str) -> tuple[str, dict[str, str]]:
    """``from_pretrained``'s first argument and extra keywords for a hub id, a folder, or a
    ``.gguf`` file (read by transformers' GGUF support, which needs the ``gguf`` and
    ``accelerate`` packages, the ``realweights`` extra): the file's folder, ``gguf_file`` its name."""
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path).expanduser()
        return str(path.parent), {"gguf_file": path.name}
    return name_or_path, {}


def load_tokenizer(name_or_path: str, revision: str | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer (hub id or local folder) and make sure it has an EOS that also pads.

    The answer region of the canvas is padded with EOS (ELF-REG §3, App. A.1), so a tokenizer without an EOS
    token cannot be used.
    """
    if name_or_path.startswith((".", "/", "~")) and not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(errno.ENOENT, "no such tokenizer or model folder", name_or_path)
    source, extra = hf_source(name_or_path)
    tok = AutoTokenizer.from_pretrained(source, revision=revision, **extra)
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer {name_or_path!r} has no EOS token; elfreg pads answers with EOS")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def check_shared_vocabulary(
    tokenizer: PreTrainedTokenizerBase,
    encoder_vocab: int,
    teacher_vocab: int | None,
    teacher_tokenizer: PreTrainedTokenizerBase | None = None,
) -> None:
    """Fail with a clear message unless encoder, teacher and tokenizer share one vocabulary.

    REPA and REG targets are read at the student's token positions, so both frozen models must
    tokenize the text identically.
    """
    if len(tokenizer) > encoder_vocab:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but the encoder's vocabulary has only {encoder_vocab}"
        )
    if teacher_vocab is not None and teacher_vocab != encoder_vocab:
        raise ValueError(
            f"encoder and teacher vocabularies differ ({encoder_vocab} vs {teacher_vocab}): "
            "ELF-REG needs one tokenizer shared by the encoder, the teacher and the decoder"
        )
    if teacher_tokenizer is not None and teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            "the teacher's tokenizer differs from the encoder's: ELF-REG needs one tokenizer shared "
            "by the encoder, the teacher and the decoder"
        )
