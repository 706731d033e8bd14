"""Atomic, resumable checkpoints.

Layout of a run folder::

    config.yaml            resolved config of the run
    metrics.jsonl          one line of loss terms per logged step
    checkpoints/step-0000500/
        model.safetensors  student weights      ema.safetensors  EMA weights
        train_state.pt     optimiser, RNG, REG statistics, step
        meta.json          step, the frozen models' dimensions and the code that wrote it
        config.yaml
    checkpoints/latest     name of the newest complete checkpoint
    checkpoints/epoch-E    a link to the checkpoint of epoch E of ``train.keep_epochs``

A ``ddp``/``fsdp2`` run writes the *sharded* form instead: ``step-N/state/`` is a
``torch.distributed.checkpoint`` folder (every rank writes its shards of the student, EMA and
optimiser, and the REG statistics; ``.metadata`` last) beside ``meta.json`` and ``config.yaml``.
It is written and published the same way (temporary folder, rename, ``latest``), and it is read
at any number of ranks, one included: :meth:`Checkpoint.model_state` consolidates it.

A checkpoint is written into a hidden temporary folder and renamed into place only when complete,
and ``latest`` is replaced atomically after that, so a crash during a save leaves the previous
checkpoint loadable. A save that fails (disk full, permissions) removes its temporary folder and
raises :class:`CheckpointWriteError` naming the checkpoint; the previous one is untouched.

Resuming never trusts ``latest`` alone: :func:`resolve_checkpoint` scans the step folders
newest first and returns the newest *intact* one (:func:`checkpoint_problem`: every file present,
safetensors headers readable and not truncated, the training state a complete archive, ``meta.json``
naming the step of its folder). When ``latest`` disagrees, or newer folders are broken, it says so
with a :class:`CheckpointWarning`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import FileSystemReader

from .config import Config
from .distributed import DistInfo
from .folders import TEMPORARY_PREFIX, fsync_dir, fsync_files, temporary_sibling
from .model.presets import student_from_config
from .model.student import STUDENT_FORMAT, Student
from .provenance import code_version

KEEP_LAST = 3
FILES = ("model.safetensors", "ema.safetensors", "train_state.pt", "meta.json", "config.yaml")
SHARDED = "state"  # the torch.distributed.checkpoint folder of the sharded form
SHARDED_FILES = (f"{SHARDED}/.metadata", "meta.json", "config.yaml")
_STEP_DIR = re.compile(r"step-(\d+)")


class CheckpointWarning(UserWarning):
    """A run folder's checkpoints were not all as ``latest`` said (the newest intact one is used)."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read; the message names the file. Bad input: exit status 2."""

    exit_status = 2


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); the previous one is intact."""


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_failure(err: BaseException, final: Path, root: Path) -> CheckpointWriteError:
    """A one-line account of why writing ``final`` failed (torch and safetensors report a full disk
    in their own words, so the free space is checked too)."""
    text = str(err)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    full = (getattr(err, "errno", None) == errno.ENOSPC or "No space left" in text or "os error 28" in text
            or (free is not None and free < (1 << 20)))
    if full:
        return CheckpointWriteError(errno.ENOSPC, f"disk full while writing checkpoint {final}; the previous "
                                    "checkpoint is intact (free some space and run the same command)")
    if isinstance(err, PermissionError):
        return CheckpointWriteError(errno.EACCES, f"permission denied writing checkpoint {final}")
    return CheckpointWriteError(getattr(err, "errno", None) or errno.EIO,
                                f"could not write checkpoint {final}: {type(err).__name__}: {text.splitlines()[0]}")


def write_weights(folder: Path, weights: dict[str, torch.Tensor], ema: dict[str, torch.Tensor],
                  train_state: dict[str, Any] | None = None) -> None:
    """A checkpoint folder's tensors in the one-process form: ``model.safetensors``,
    ``ema.safetensors`` and, when given, ``train_state.pt``. Every writer of such a folder (a
    training checkpoint, ``elfreg export``, ``elfreg import-elf``) writes them here."""
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, folder / "model.safetensors")
    save_file({k: v.detach().contiguous().cpu() for k, v in ema.items()}, folder / "ema.safetensors")
    if train_state is not None:
        torch.save(train_state, folder / "train_state.pt")


def write_description(folder: Path, cfg: Config, meta: dict[str, Any]) -> None:
    """A checkpoint folder's ``meta.json`` and ``config.yaml``."""
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))
    cfg.save(folder / "config.yaml")


def save_checkpoint(run_dir: Path, step: int, cfg: Config, model: torch.nn.Module,
                    ema_state: dict[str, torch.Tensor], train_state: dict[str, Any],
                    meta: dict[str, Any]) -> Path:
    """The one-process form: safetensors of the weights and EMA, ``train_state.pt``."""
    return write_checkpoint(run_dir, step, cfg, meta,
                            lambda tmp: write_weights(tmp, model.state_dict(), ema_state, train_state))


def write_checkpoint(run_dir: Path, step: int, cfg: Config, meta: dict[str, Any],
                     write: Callable[[Path], None], ranks: Any = None) -> Path:
    """Write checkpoint ``step``: ``write(tmp)`` fills a hidden temporary folder (on every rank,
    collectively, when ``ranks`` is a process group's :class:`~elfreg.distributed.DistInfo`),
    then ``meta.json`` and ``config.yaml``, every file fsynced; rank 0 then renames the folder
    into place and replaces ``latest``. A failure on any rank removes the temporary folder and
    raises :class:`CheckpointWriteError` on every rank; the previous checkpoint is untouched, and
    a rank killed mid-write leaves only a temporary folder (removed when the run resumes)."""
    ranks = ranks or DistInfo()
    root = Path(run_dir) / "checkpoints"
    name = f"step-{step:07d}"
    final = root / name
    tmp = None
    err: BaseException | None = None
    try:
        if ranks.is_main:
            tmp = temporary_sibling(final)
        tmp = ranks.broadcast(tmp)
        write(tmp)
        if ranks.is_main:
            write_description(tmp, cfg, {**meta, "step": step, "code": code_version()})
            fsync_files(tmp)
    except Exception as e:
        err = e
    except BaseException:
        if tmp is not None and ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    failed = int(ranks.sum(torch.tensor([float(err is not None)])).item()) if ranks.world > 1 else int(err is not None)
    if failed:
        if tmp is not None and ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if err is None:
            raise CheckpointWriteError(errno.EIO, f"could not write checkpoint {final}: another rank failed")
        raise _write_failure(err, final, root) from err
    if ranks.is_main:
        _publish(tmp, final, root, name)
        if meta.get("kept_epoch") is not None:
            link = root / f"epoch-{meta['kept_epoch']:g}"
            tmp_link = root / f".{link.name}.tmp"
            tmp_link.unlink(missing_ok=True)
            tmp_link.symlink_to(name)
            os.replace(tmp_link, link)
    return final


def _publish(tmp: Path, final: Path, root: Path, name: str) -> None:
    """Rename a complete temporary folder into place, then replace ``latest`` and prune."""
    if final.exists():
        problem = checkpoint_problem(final)
        if problem is None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FileExistsError(f"{final} already holds an intact checkpoint; refusing to write over it")
        aside = root / f".broken-{name}-{int(time.time())}"
        os.rename(final, aside)  # kept for inspection, never deleted silently
        warnings.warn(f"{final} was broken ({problem}); moved aside to {aside.name}", CheckpointWarning, stacklevel=2)
    os.rename(tmp, final)
    fsync_dir(root)
    _write_text_atomic(root / "latest", name)
    for old in step_folders(root)[:-KEEP_LAST]:
        if not _kept(old):
            shutil.rmtree(old, ignore_errors=True)


def _kept(ckpt: Path) -> bool:
    """Whether a checkpoint is one of ``train.keep_epochs`` (rotation leaves it)."""
    try:
        return json.loads((ckpt / "meta.json").read_text()).get("kept_epoch") is not None
    except (OSError, ValueError):
        return False


def step_folders(root: Path) -> list[Path]:
    """The ``step-N`` folders under ``root`` (a checkpoints folder), oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def _safetensors_problem(path: Path) -> str | None:
    """Header readable and the file as long as the header says (a cut file is caught here)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        size = path.stat().st_size
    except (OSError, struct.error, ValueError, KeyError, TypeError) as err:
        return f"{path.name}: unreadable header ({type(err).__name__})"
    if size < 8 + n + end:
        return f"{path.name}: truncated ({size} of {8 + n + end} bytes)"
    return None


def is_sharded(ckpt: Path) -> bool:
    """Whether ``ckpt`` is in the sharded form (a ``state/`` folder) rather than the one-process one."""
    return (ckpt / SHARDED).is_dir()


def _sharded_problem(folder: Path) -> str | None:
    """``.metadata`` readable and every shard file it names present and long enough."""
    try:
        meta = FileSystemReader(str(folder)).read_metadata()
        need: dict[str, int] = {}
        for info in meta.storage_data.values():
            need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    except Exception as err:  # noqa: BLE001 - pickle and DCP raise many kinds
        return f"{SHARDED}/.metadata: unreadable ({type(err).__name__})"
    for rel, size in sorted(need.items()):
        path = folder / rel
        if not path.is_file():
            return f"{SHARDED}/{rel}: missing"
        if path.stat().st_size < size:
            return f"{SHARDED}/{rel}: truncated ({path.stat().st_size} of {size} bytes)"
    return None


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` is not an intact checkpoint (either form), or None when it is."""
    sharded = is_sharded(ckpt)
    missing = [f for f in (SHARDED_FILES if sharded else FILES) if not (ckpt / f).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    if sharded:
        problem = _sharded_problem(ckpt / SHARDED)
        if problem:
            return problem
    else:
        for name in ("model.safetensors", "ema.safetensors"):
            problem = _safetensors_problem(ckpt / name)
            if problem:
                return problem
        if not zipfile.is_zipfile(ckpt / "train_state.pt"):
            return "train_state.pt: not a complete archive"
    try:
        step = json.loads((ckpt / "meta.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return "meta.json: unreadable or without a step"
    m = _STEP_DIR.fullmatch(ckpt.name)
    if m and int(m.group(1)) != step:
        return f"meta.json says step {step}, the folder step {int(m.group(1))}"
    return None


def clean_temporaries(run_dir: str | Path) -> list[Path]:
    """Remove what interrupted saves left behind (``.tmp-step-*`` folders, ``.latest.*`` files);
    call only while holding the run folder's lock. Returns what was removed."""
    root = Path(run_dir) / "checkpoints"
    stale = [*root.glob(f"{TEMPORARY_PREFIX}step-*"), *root.glob(".latest.*")] if root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return stale


def has_checkpoints(run_dir: str | Path) -> bool:
    """Whether a run folder holds any checkpoint, intact or not (``--fresh`` refuses then)."""
    root = Path(run_dir) / "checkpoints"
    return bool(step_folders(root)) or (root / "latest").exists()


def resolve_checkpoint(path: str | Path) -> Path | None:
    """A checkpoint folder itself, or the newest intact checkpoint of a run or checkpoints folder
    (``None`` when it has none). Warns (:class:`CheckpointWarning`) when newer step folders are
    broken or ``latest`` names another one."""
    path = Path(path)
    if (path / "model.safetensors").exists() or (path / SHARDED_FILES[0]).exists():
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    broken = []
    found = None
    for ckpt in reversed(step_folders(root)):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            found = ckpt
            break
        broken.append(f"{ckpt.name} ({problem})")
    if broken:
        warnings.warn(f"skipped broken checkpoints in {root}: {'; '.join(broken)}", CheckpointWarning, stacklevel=2)
    latest = root / "latest"
    named = latest.read_text(errors="replace").strip() if latest.is_file() else None
    if found is not None and named != found.name and not broken:
        warnings.warn(f"{latest} names {named!r}, but the newest intact checkpoint is {found.name}; using it",
                      CheckpointWarning, stacklevel=2)
    return found


def read_sharded(folder: Path, part: str) -> dict[str, torch.Tensor]:
    """The full (consolidated) tensors of ``part`` (``model``, ``ema``, ``extra``) of a sharded
    checkpoint's ``state/`` folder, read by this process alone whatever the ranks that wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        meta = FileSystemReader(str(folder)).read_metadata()
        prefix = f"{part}."
        want = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in meta.state_dict_metadata.items()
                if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)}
        with warnings.catch_warnings():  # DCP says it assumes one process: that is the point
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(want, checkpoint_id=str(folder), no_dist=True)
    except Exception as err:  # noqa: BLE001 - DCP raises its own error types
        raise CheckpointError(f"cannot read {folder}: {str(err).strip().splitlines()[0]}") from err
    return {k[len(prefix):]: v for k, v in want.items()}


@dataclass
class Checkpoint:
    path: Path
    config: Config
    meta: dict[str, Any]

    @property
    def sharded(self) -> bool:
        """Written by a ``ddp``/``fsdp2`` run (the ``state/`` folder; see the module docstring)."""
        return is_sharded(self.path)

    def _tensors(self, name: str) -> dict[str, torch.Tensor]:
        if self.sharded:
            return read_sharded(self.path / SHARDED, name.split(".")[0])
        try:
            return load_file(self.path / name)
        except Exception as err:  # safetensors raises its own error type
            raise CheckpointError(f"cannot read {self.path / name}: {str(err).splitlines()[0]}") from err

    def load_student(self, use_ema: bool = True, device: str | torch.device = "cpu") -> Student:
        """Rebuild the student from the checkpoint's config and load (EMA) weights. A checkpoint
        of another student format (:data:`~elfreg.model.student.STUDENT_FORMAT`) or whose tensors
        do not fit the config fails with :class:`CheckpointError` in one line."""
        found = self.meta.get("student_format", 1)
        if found != STUDENT_FORMAT:
            raise CheckpointError(
                f"{self.path} holds a student of format {found} (elfreg {'0.1' if found == 1 else '?'}), this "
                f"elfreg reads format {STUDENT_FORMAT} (ELF's network, docs/elf.md): train it again")
        student = student_from_config(self.config, self.meta["enc_dim"], self.meta["vocab_size"],
                                      self.meta.get("teacher_dim"))
        state = self._tensors("ema.safetensors" if use_ema else "model.safetensors")
        mine = {k: tuple(v.shape) for k, v in student.state_dict().items()}
        theirs = {k: tuple(v.shape) for k, v in state.items()}
        if mine != theirs:
            odd = sorted(set(mine) ^ set(theirs)) or [k for k in mine if mine[k] != theirs[k]]
            raise CheckpointError(f"{self.path}: its tensors do not fit the student its config describes "
                                  f"({len(odd)} differ, first {odd[0]})")
        student.load_state_dict(state)
        return student.to(device).eval()

    def model_state(self) -> dict[str, torch.Tensor]:
        return self._tensors("model.safetensors")

    def ema_state(self) -> dict[str, torch.Tensor]:
        return self._tensors("ema.safetensors")

    def train_state(self) -> dict[str, Any]:
        """The training state: ``train_state.pt``, or the REG statistics of a sharded checkpoint
        (its optimiser state is read by :func:`elfreg.train.sharded.restore`)."""
        if self.sharded:
            return self._tensors("extra")
        try:
            return torch.load(self.path / "train_state.pt", weights_only=False)
        except Exception as err:
            raise CheckpointError(f"cannot read {self.path / 'train_state.pt'}: {str(err).splitlines()[0]}") from err


def open_checkpoint(path: str | Path) -> Checkpoint:
    ckpt = resolve_checkpoint(path)
    if ckpt is None:
        raise FileNotFoundError(errno.ENOENT, f"no intact checkpoint found at {path} (expected model.safetensors "
                                "or checkpoints/step-*)", str(path))
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {ckpt / 'meta.json'}: {err}") from err
    return Checkpoint(ckpt, Config.load(ckpt / "config.yaml"), meta)
