"""``elfreg export --checkpoint DIR --out DIR``: a release folder from any training checkpoint.

The release holds what sampling and evaluation need and nothing of the optimiser::

    model.safetensors   the student's weights, consolidated (whole tensors, whatever the ranks)
    ema.safetensors     its EMA weights (what ``elfreg sample`` / ``elfreg eval`` use)
    config.yaml         the training run's config
    meta.json           frozen-model dimensions, the step, canvas statistics of the data
    tokenizer/          the tokenizer (``elfreg sample`` prefers it to the encoder's)
    README.md           a card: the training config, the data and its canvas statistics

``elfreg sample --checkpoint OUT`` and ``elfreg eval --checkpoint OUT`` load it directly. It is
written into a hidden temporary folder beside ``OUT`` and renamed into place when complete, so
an interrupted export leaves no half release; an existing ``OUT`` is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from ..checkpoint import open_checkpoint, write_description, write_weights
from ..folders import written_whole
from ..text.load import resolve_model_ids
from ..text.tokenizer import load_tokenizer

TOKENIZER_DIR = "tokenizer"


def export_release(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the release folder of ``checkpoint`` (a checkpoint or run folder) at ``out``."""
    ckpt = open_checkpoint(checkpoint)
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; choose a new --out")
    with written_whole(out) as tmp:
        write_weights(tmp, ckpt.model_state(), ckpt.ema_state())
        meta = {**ckpt.meta, "exported_from": str(ckpt.path.resolve())}
        write_description(tmp, ckpt.config, meta)
        text = resolve_model_ids(ckpt.config.text)
        revision = text.encoder_revision if text.tokenizer is None else None
        load_tokenizer(text.tokenizer or text.encoder, revision).save_pretrained(tmp / TOKENIZER_DIR)
        (tmp / "README.md").write_text(model_card(ckpt.config.to_dict(), meta))
    return out


def model_card(config: dict, meta: dict) -> str:
    """The release's README: what was trained, on what, and how to use it."""
    canvas = meta.get("canvas") or {}
    data = config.get("data", {})
    model = config.get("model", {})
    kind = "ELF-REG" if model.get("extra_token") == "reg" or model.get("repa") else "ELF"
    lines = [
        f"# {kind} student (step {meta.get('step')})",
        "",
        "A continuous flow-matching diffusion language model trained with elfreg. Load it with",
        "`elfreg sample --checkpoint THIS_FOLDER --prompt \"...\"` or "
        "`elfreg eval --checkpoint THIS_FOLDER --task TASK`.",
        "The frozen encoder is not included: it is loaded from `text.encoder` of `config.yaml`.",
        "",
        "## Training",
        "",
        f"- steps: {meta.get('step')} of {config.get('train', {}).get('steps')}; ranks: {meta.get('world_size', 1)} "
        f"({meta.get('parallel', 'none')})",
        f"- encoder: {config['text']['encoder']} (layer {config['text']['encoder_layer']}); "
        f"teacher: {config['text'].get('teacher') if kind == 'ELF-REG' else 'none'}",
        f"- widths: encoder {meta.get('enc_dim')}, teacher {meta.get('teacher_dim')}, "
        f"vocabulary {meta.get('vocab_size')}",
        "",
        "## Data",
        "",
        f"- source: {data.get('source')} {data.get('path') or ''}".rstrip(),
        f"- canvases built: {canvas.get('examples', 'unknown')}; prompts cut: {canvas.get('prompts_truncated', 0)}; "
        f"answers cut: {canvas.get('answers_truncated', 0)} (canvas {config['text']['canvas_len']} tokens, "
        f"prompt cap {config['text']['prompt_cap']})",
        "",
        "## Config",
        "",
        "```yaml",
        yaml.safe_dump(config, sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    out = export_release(args.checkpoint, args.out)
    print(f"exported {out} (model, EMA, config, tokenizer, README)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a release folder (consolidated weights, config, tokenizer, card)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder, or a run folder (its newest intact one)")
    p.add_argument("--out", required=True, help="the release folder to create (must not exist)")
    p.set_defaults(func=run)
