"""``elfreg params``: parameter counts split as in the paper's Table 7."""

from __future__ import annotations

import argparse

import torch

from ..config import Config
from .presets import KNOWN_FROZEN, PAPER_COUNTS, PRESETS, build_on_meta, student_from_config


def _width_and_vocab(name: str, revision: str | None) -> tuple[int, int]:
    """(hidden width, vocabulary) of a frozen model: known paper models offline, else its HF config."""
    if name in KNOWN_FROZEN and revision is None:
        return KNOWN_FROZEN[name]
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(name, revision=revision)
    return hf.hidden_size, hf.vocab_size


def _frozen_dims(cfg: Config) -> tuple[int, int, int | None]:
    """Encoder width, vocabulary and teacher width of a run config."""
    from ..text.load import resolve_model_ids

    text = resolve_model_ids(cfg.text)
    enc_dim, vocab = _width_and_vocab(text.encoder, text.encoder_revision)
    teacher = None
    if text.teacher and cfg.needs_teacher:
        teacher = _width_and_vocab(text.teacher, text.teacher_revision)[0]
    return enc_dim, vocab, teacher


def format_counts(name: str, groups: dict[str, int]) -> str:
    line = (f"{name:<12} non-decoder {groups['non_decoder'] / 1e6:8.2f}M  decoder {groups['decoder'] / 1e6:8.2f}M"
            f"  (training-only REPA projector {groups['training_only_projector'] / 1e6:.2f}M,"
            f" used at inference {groups['inference'] / 1e6:.2f}M)")
    if name in PAPER_COUNTS:
        a, b = PAPER_COUNTS[name]
        line += f"  paper: {a / 1e6:.0f}M + {b / 1e6:.0f}M"
    return line


def run(args: argparse.Namespace) -> int:
    if args.config:
        cfg = Config.load(args.config, args.override)
        with torch.device("meta"):
            student = student_from_config(cfg, *_frozen_dims(cfg))
        print(format_counts(args.config, student.parameter_groups()))
        return 0
    names = list(PAPER_COUNTS) if args.preset == "all" else [args.preset]
    for name in names:
        print(format_counts(name, build_on_meta(name).parameter_groups()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("params", help="print student parameter counts (Table 7 split)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--preset", choices=[*PRESETS, "all"], help="paper presets use Qwen3 widths, built on meta")
    g.add_argument("--config", help="a run config (frozen-model widths read from their HF configs)")
    p.add_argument("override", nargs="*", help="key.sub=value overrides for --config")
    p.set_defaults(func=run)
