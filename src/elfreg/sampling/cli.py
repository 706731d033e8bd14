"""``elfreg sample``: answers for prompts from a checkpoint (ELF-REG §3, App. C).

    elfreg sample --checkpoint RUN_DIR --question "..." [--prompt "..."] [--prompts-file FILE]
                  [--samples 1] [--seed 0] [--out DIR [--trajectories [--record-every k]]]
                  [--sampler early-stop] [--nfe 64] [--sc-cfg 3] [every other sample.* setting]

``--question`` is written into a whole prompt as the checkpoint's training prompts were (its
template, or its data source's own format: :func:`elfreg.text.templates.prompt_for`);
``--prompt`` and ``--prompts-file`` are whole prompts, read as they are. Every sampler setting is
a flag named after its field of ``SampleConfig`` (``--renoise-eta``, ``--adaptive-patience``,
...); unset ones come from the checkpoint's config. Prints every answer
with the NFE it used. ``--out`` is a folder, as for every other command: ``samples.jsonl`` (one
JSON object per sample), ``settings.json`` (the checkpoint, the resolved sampler settings, seeds
and code version) and, with ``--trajectories``, ``trajectories/`` (one .safetensors per sample).
A folder that already holds samples is refused rather than overwritten.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ..config import SAMPLING_PRESETS, SampleConfig, add_config_flags, add_progress_flag, config_flag_values
from ..device import add_device_flags
from ..host_memory import add_host_memory_flag, apply_host_memory
from ..jsonl import iter_jsonl, write_jsonl
from ..provenance import code_version
from ..runs import write_json_atomic

SAMPLES_NAME = "samples.jsonl"
SETTINGS_NAME = "settings.json"
TRAJECTORIES_NAME = "trajectories"


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """Every ``SampleConfig`` field as a flag, and ``--sampling NAME`` (:data:`SAMPLING_PRESETS`)."""
    add_config_flags(parser, SampleConfig, "sampler settings (sample.*)",
                     default_note="default: the checkpoint's; {default} in a new config")
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


def _check_out(out: str | None, trajectories: bool) -> Path | None:
    """The ``--out`` folder, refused before any work if it is a file or already holds samples."""
    if out is None:
        if trajectories:
            raise ValueError("--trajectories needs --out DIR (they are written to DIR/trajectories/)")
        return None
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out: {folder} is a file; --out names a folder (samples go to {SAMPLES_NAME} in it)")
    for name in (SAMPLES_NAME, TRAJECTORIES_NAME):
        if (folder / name).exists():
            raise ValueError(f"--out: {folder} already holds {name}; give another folder or remove it")
    return folder


def _write_out(folder: Path, args: argparse.Namespace, prompts: list[str], sample: SampleConfig,
               results: list) -> None:
    """``samples.jsonl`` and ``settings.json``, each written whole and then renamed into place."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"checkpoint": str(args.checkpoint), "weights": "raw" if args.raw_weights else "ema",
                "samples": args.samples, "seed": args.seed, "prompts": len(prompts),
                "sample": dataclasses.asdict(sample), "code": code_version()}
    write_json_atomic(folder / SETTINGS_NAME, settings)
    write_jsonl(folder / SAMPLES_NAME, ({"prompt": prompts[r.prompt_index], **r.as_dict()} for r in results))
    if args.trajectories:
        trajectories = folder / TRAJECTORIES_NAME
        trajectories.mkdir()
        for r in results:
            r.trajectory.save(trajectories / f"prompt{r.prompt_index:05d}_sample{r.sample_index:03d}.safetensors")
    what = f"{len(results)} samples" + (" and their trajectories" if args.trajectories else "")
    print(f"wrote {what} to {folder}")


def run(args: argparse.Namespace) -> int:
    from ..text.templates import prompt_for
    from .generation import generate, load_checkpoint

    prompts = list(args.prompt or [])
    if args.prompts_file:
        prompts += _read_prompts(args.prompts_file)
    if not prompts and not args.question:
        raise ValueError("give at least one --question, --prompt or a --prompts-file")
    out = _check_out(args.out, args.trajectories)
    overrides = sample_overrides(args)
    SampleConfig().replace(**overrides)  # bad settings fail before the checkpoint is loaded
    apply_host_memory(args.host_memory)
    models = load_checkpoint(args.checkpoint, args.device, args.precision, use_ema=not args.raw_weights)
    prompts = [prompt_for(models.config.data, q) for q in args.question or []] + prompts
    sample = models.config.sample.replace(**overrides)
    results = generate(models, prompts, sample, samples=args.samples,
                       seed=args.seed, batch_size=args.batch_size, compile=args.compile,
                       record_every=args.record_every if args.trajectories else 0, progress=not args.no_progress)

    for r in results:
        if r.sample_index == 0:
            print(f"prompt {r.prompt_index}: {prompts[r.prompt_index]}")
        exit_note = f", stopped early at step {r.steps}" if r.early_exit else ""
        print(f"  sample {r.sample_index} (seed {r.seed}, {r.nfe} NFE{exit_note}): {r.text}")
    if out is not None:
        _write_out(out, args, prompts, sample, results)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate answers from a checkpoint",
                       description="Generate answers with an ELF-REG checkpoint (ELF-REG §3, App. C). Unset sampler "
                                   "settings come from the checkpoint's config.")
    p.add_argument("--checkpoint", required=True, help="run folder, checkpoints folder or one checkpoint")
    p.add_argument("--question", action="append",
                   help="a question, written into a prompt as the checkpoint's training prompts were (repeatable)")
    p.add_argument("--prompt", action="append", help="a whole prompt, read as it is (repeatable)")
    p.add_argument("--prompts-file", help="prompts: one per line, or a .jsonl file with a 'prompt' field")
    p.add_argument("--samples", type=int, default=1, help="samples per prompt; sample j uses seed + j")
    p.add_argument("--seed", type=int, default=0, help="seed of sample 0 (sample j uses seed + j; default 0)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per network batch (default 8)")
    add_device_flags(p)
    p.add_argument("--raw-weights", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--compile", action="store_true",
                   help="run the student through torch.compile (pays over many calls at small shapes)")
    p.add_argument("--out", metavar="DIR", help=f"folder for {SAMPLES_NAME} (one JSON object per sample) and "
                                                f"{SETTINGS_NAME}; refused if it already holds samples")
    p.add_argument("--trajectories", action="store_true",
                   help=f"also save one trajectory (.safetensors) per sample in DIR/{TRAJECTORIES_NAME}/")
    p.add_argument("--record-every", type=int, default=1, help="trajectories: record every k-th step (default 1)")
    add_progress_flag(p)
    add_host_memory_flag(p)
    add_sampling_flags(p)
    p.set_defaults(func=run)
