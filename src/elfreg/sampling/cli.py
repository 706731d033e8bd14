"""``elfreg sample``: answers for prompts from a checkpoint (spec §4).

    elfreg sample --checkpoint RUN_DIR --prompt "..." [--prompt "..."] [--prompts-file FILE]
                  [--samples 1] [--seed 0] [--out answers.jsonl] [--trajectory-dir DIR]
                  [--sampler early-stop] [--nfe 64] [--sc-cfg 3] [every other sample.* setting]

Every sampler setting is a flag named after its field of ``SampleConfig`` (``--renoise-eta``,
``--adaptive-patience``, ...); unset ones come from the checkpoint's config. Prints every answer
with the NFE it used; ``--out`` writes one JSON object per sample.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..config import SAMPLING_PRESETS, SampleConfig, add_config_flags, config_flag_values
from ..device import PRECISIONS
from ..host_memory import add_host_memory_flag, apply_host_memory
from ..jsonl import iter_jsonl


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """Every ``SampleConfig`` field as a flag, and ``--sampling NAME`` (:data:`SAMPLING_PRESETS`)."""
    add_config_flags(parser, SampleConfig, "sampler settings (sample.*; default: the checkpoint's)")
    parser.add_argument("--sampling", choices=sorted(SAMPLING_PRESETS),
                        help="named sampler settings, under any flag given: "
                             + "; ".join(f"{k}: " + ", ".join(f"{f}={v}" for f, v in p.items())
                                         for k, p in SAMPLING_PRESETS.items()))


def sample_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The sampler settings a command line gives: those of ``--sampling NAME`` under the explicit
    flags (:func:`add_sampling_flags`)."""
    return {**SAMPLING_PRESETS.get(getattr(args, "sampling", None) or "", {}), **config_flag_values(args, SampleConfig)}


def _read_prompts(path: str) -> list[str]:
    """One prompt per line of a text file, or the ``prompt`` field of each line of a .jsonl file
    (bad bytes and bad lines fail naming the file and line)."""
    if path.endswith(".jsonl"):
        prompts = []
        for lineno, record in iter_jsonl(path):
            if not isinstance(record.get("prompt"), str):
                raise ValueError(f"{path}:{lineno}: expected a string field 'prompt'")
            prompts.append(record["prompt"])
        return prompts
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    return [line for line in text.splitlines() if line.strip()]


def run(args: argparse.Namespace) -> int:
    from .generate import generate, load_checkpoint

    prompts = list(args.prompt or [])
    if args.prompts_file:
        prompts += _read_prompts(args.prompts_file)
    if not prompts:
        raise ValueError("give at least one --prompt or a --prompts-file")
    overrides = sample_overrides(args)
    SampleConfig().replace(**overrides)  # bad settings fail before the checkpoint is loaded
    apply_host_memory(args.host_memory)
    models = load_checkpoint(args.checkpoint, args.device, args.precision, use_ema=not args.raw_weights)
    results = generate(models, prompts, models.config.sample.replace(**overrides), samples=args.samples,
                       seed=args.seed, batch_size=args.batch_size, compile=args.compile,
                       record_every=args.record_every if args.trajectory_dir else 0, progress=not args.no_progress)

    for r in results:
        if r.sample_index == 0:
            print(f"prompt {r.prompt_index}: {prompts[r.prompt_index]}")
        exit_note = f", stopped early at step {r.steps}" if r.early_exit else ""
        print(f"  sample {r.sample_index} (seed {r.seed}, {r.nfe} NFE{exit_note}): {r.text}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps({"prompt": prompts[r.prompt_index], **r.as_dict()},
                                   ensure_ascii=False) + "\n")
        print(f"wrote {len(results)} samples to {out}")
    if args.trajectory_dir:
        folder = Path(args.trajectory_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for r in results:
            r.trajectory.save(folder / f"prompt{r.prompt_index:05d}_sample{r.sample_index:03d}.safetensors")
        print(f"wrote {len(results)} trajectories to {folder}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate answers from a checkpoint",
                       description="Generate answers with an ELF-REG checkpoint (spec §4). Unset sampler "
                                   "settings come from the checkpoint's config.")
    p.add_argument("--checkpoint", required=True, help="run folder, checkpoints folder or one checkpoint")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="prompts: one per line, or a .jsonl file with a 'prompt' field")
    p.add_argument("--samples", type=int, default=1, help="samples per prompt; sample j uses seed + j")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    p.add_argument("--raw-weights", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--compile", action="store_true",
                   help="run the student through torch.compile (pays over many calls at small shapes)")
    p.add_argument("--out", help="write one JSON object per sample to this .jsonl file")
    p.add_argument("--trajectory-dir", help="save one trajectory file (.safetensors) per sample here")
    p.add_argument("--record-every", type=int, default=1, help="trajectory: record every k-th step")
    p.add_argument("--no-progress", action="store_true")
    add_host_memory_flag(p)
    add_sampling_flags(p)
    p.set_defaults(func=run)
