"""Fakes for evaluation runs: a checkpoint folder with a config and no weights, a tiny GSM8K-style
data file, and a deterministic generator for the one seam into the sampling room
(``elfreg.eval.generation._generate``)."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from elfreg.cli import main
from elfreg.config import Config, SampleConfig


def eval_main(argv: list[str]) -> int:
    """``elfreg eval ARGV`` in this process, through the ``elfreg`` command; its exit status."""
    return main(["eval", *argv])


def fake_checkpoint(folder: Path) -> Path:
    """A folder that :func:`elfreg.checkpoint.open_checkpoint` accepts as intact (every file, no
    weights in them): enough for everything before the sampling room, which the fake replaces."""
    folder.mkdir(parents=True, exist_ok=True)
    Config().save(folder / "config.yaml")
    step = int(folder.name.split("-")[1]) if folder.name.startswith("step-") else 0
    (folder / "meta.json").write_text(json.dumps({"step": step}))
    for name in ("model.safetensors", "ema.safetensors"):
        save_file({}, folder / name)
    torch.save({}, folder / "train_state.pt")
    return folder


def gsm8k_file(path: Path, n: int) -> Path:
    """``n`` problems ``q<i>`` whose answer is ``i + 1``."""
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"work\n#### {i + 1}"}) + "\n"
                            for i in range(n)))
    return path


def problem_number(prompt: str) -> int:
    """``i`` of the problem ``q<i>`` a prompt asks, whatever the template around it."""
    return int(re.search(r"\bq(\d+)\b", prompt).group(1))


class FakeGenerator:
    """Deterministic texts: the answer of prompt ``q<i>`` with seed ``s`` is right when
    ``(i + s) % 3 != 0``. Records every call as ``(prompts, seed, samples)``; ``on_call(k)`` runs
    at the start of call ``k`` (0-based) — to interrupt a run mid-way."""

    def __init__(self, on_call: Callable[[int], None] | None = None) -> None:
        self.calls: list[tuple[list[str], int, int]] = []
        self.on_call = on_call

    @staticmethod
    def text(prompt: str, seed: int) -> str:
        i = problem_number(prompt)
        return f"so #### {i + 1}" if (i + seed) % 3 else "so #### -1"

    def __call__(self, checkpoint: Path, prompts: list[str], sample: SampleConfig, samples: int, seed: int,
                 batch_size: int, device: str, precision: str) -> list[list[str]]:
        if self.on_call is not None:
            self.on_call(len(self.calls))
        self.calls.append((list(prompts), seed, samples))
        return [[self.text(p, seed + j) for j in range(samples)] for p in prompts]


def signal_on_call(k: int, sig: int = signal.SIGINT) -> Callable[[int], None]:
    """An ``on_call`` that sends ``sig`` to this process at the start of call ``k``."""
    def on_call(n: int) -> None:
        if n == k:
            os.kill(os.getpid(), sig)
    return on_call


def raise_on_call(k: int) -> Callable[[int], None]:
    """An ``on_call`` that raises KeyboardInterrupt at the start of call ``k`` (what a second
    signal does)."""
    def on_call(n: int) -> None:
        if n == k:
            raise KeyboardInterrupt
    return on_call
