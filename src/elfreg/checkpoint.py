"""Atomic, resumable checkpoints.

Layout of a run folder::

    config.yaml            resolved config of the run
    metrics.jsonl          one line of loss terms per logged step
    checkpoints/step-0000500/
        model.safetensors  student weights      ema.safetensors  EMA weights
        train_state.pt     optimiser, RNG, REG statistics, step
        meta.json          step and the frozen models' dimensions
        config.yaml
    checkpoints/latest     name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder and renamed into place only when complete,
and ``latest`` is replaced atomically after that, so a crash during a save leaves the previous
checkpoint loadable.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .config import Config
from .model.presets import student_from_config
from .model.student import Student

KEEP_LAST = 3


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, step: int, cfg: Config, model: torch.nn.Module,
                    ema_state: dict[str, torch.Tensor], train_state: dict[str, Any],
                    meta: dict[str, Any]) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:07d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{name}-"))
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()},
                  tmp / "model.safetensors")
        save_file({k: v.contiguous().cpu() for k, v in ema_state.items()}, tmp / "ema.safetensors")
        torch.save(train_state, tmp / "train_state.pt")
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=2))
        cfg.save(tmp / "config.yaml")
        for f in tmp.iterdir():
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = root / name
    if final.exists():  # re-saving a step (e.g. after a resume): replace the old copy
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _write_text_atomic(root / "latest", name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-KEEP_LAST]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | Path) -> Path | None:
    """A checkpoint folder from a run folder (its latest), a checkpoints folder, or itself."""
    path = Path(path)
    if (path / "model.safetensors").exists():
        return path
    for root in (path / "checkpoints", path):
        latest = root / "latest"
        if latest.exists():
            ckpt = root / latest.read_text().strip()
            if (ckpt / "model.safetensors").exists():
                return ckpt
    return None


@dataclass
class Checkpoint:
    path: Path
    config: Config
    meta: dict[str, Any]

    def load_student(self, use_ema: bool = True, device: str | torch.device = "cpu") -> Student:
        """Rebuild the student from the checkpoint's config and load (EMA) weights."""
        student = student_from_config(self.config, self.meta["enc_dim"], self.meta["vocab_size"],
                                      self.meta.get("teacher_dim"))
        weights = load_file(self.path / ("ema.safetensors" if use_ema else "model.safetensors"))
        student.load_state_dict(weights)
        return student.to(device).eval()

    def model_state(self) -> dict[str, torch.Tensor]:
        return load_file(self.path / "model.safetensors")

    def ema_state(self) -> dict[str, torch.Tensor]:
        return load_file(self.path / "ema.safetensors")

    def train_state(self) -> dict[str, Any]:
        return torch.load(self.path / "train_state.pt", weights_only=False)


def open_checkpoint(path: str | Path) -> Checkpoint:
    ckpt = resolve_checkpoint(path)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint found at {path} (expected model.safetensors or checkpoints/latest)")
    cfg = Config.load(ckpt / "config.yaml")
    meta = json.loads((ckpt / "meta.json").read_text())
    return Checkpoint(ckpt, cfg, meta)
