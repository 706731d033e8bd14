"""``elfreg train --config FILE.yaml [key.sub=value ...]``, alone or under ``torchrun
--nproc_per_node N --no-python elfreg train ...`` (``train.parallel: ddp | fsdp2``). Failures
propagate to the one handler of :mod:`elfreg.cli` (one line, non-zero exit, the rank named
under torchrun)."""

from __future__ import annotations

import argparse

from ..config import Config, add_progress_flag


def run(args: argparse.Namespace) -> int:
    from ..distributed import env_dist, shutdown_distributed
    from .loop import train

    cfg = Config.load(args.config, [*args.override, *(["train.progress=false"] if args.no_progress else [])])
    result = train(cfg, resume=not args.fresh)
    shutdown_distributed()
    if env_dist().is_main:  # under torchrun only rank 0 reports
        losses = ", ".join(f"{k} {v:.4f}" for k, v in result.last_losses.items())
        print(f"trained to step {result.step}; last losses: {losses}; checkpoint: {result.checkpoint}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an ELF-REG student from a YAML config")
    p.add_argument("--config", required=True, help="YAML config (see configs/)")
    p.add_argument("--fresh", action="store_true",
                   help="refuse to continue an existing run (default: resume from train.out_dir)")
    add_progress_flag(p)  # as train.progress=false, and the libraries' bars too
    p.add_argument("override", nargs="*", help="key.sub=value overrides, e.g. train.steps=200")
    p.set_defaults(func=run)
