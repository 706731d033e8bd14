"""Folders written whole or not at all: the one place elfreg writes a folder atomically.

A folder is filled in a hidden temporary sibling (``.tmp-<name>-...`` beside it), its files are
fsynced, and it is renamed into place only when complete; whatever stops the writing (an
exception, a signal, a full disk) removes the temporary folder, and a process killed mid-write
leaves only that temporary folder, never a half-written one under the final name. Checkpoints
(:mod:`elfreg.checkpoint`, whose many-rank form shares the steps and publishes with its own
``latest`` and rotation), release folders (``elfreg export``), imported ELF checkpoints
(``elfreg import-elf``) and the toy assets are written this way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["TEMPORARY_PREFIX", "fsync_dir", "fsync_files", "temporary_sibling", "written_whole"]

TEMPORARY_PREFIX = ".tmp-"


def temporary_sibling(final: Path, tag: str = "") -> Path:
    """A new empty hidden folder beside ``final``: ``.tmp-<final's name>-<tag><random>``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f"{TEMPORARY_PREFIX}{final.name}-{tag}"))


def fsync_files(folder: Path) -> None:
    """Every file under ``folder`` flushed to disk."""
    for f in (f for f in folder.rglob("*") if f.is_file() and not f.is_symlink()):
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())


def fsync_dir(path: Path) -> None:
    """A folder's entries (a rename into it) flushed to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def written_whole(final: str | os.PathLike, tag: str = "") -> Iterator[Path]:
    """Fill the yielded temporary folder; on a clean exit it becomes ``final`` (which must not
    exist: ``FileExistsError``, checked before and at the rename), on any exception it is
    removed and the exception goes on."""
    final = Path(final)
    if final.exists():
        raise FileExistsError(f"{final} already exists")
    tmp = temporary_sibling(final, tag)
    try:
        yield tmp
        fsync_files(tmp)
        if final.exists():  # rename() would replace an empty folder made meanwhile
            raise FileExistsError(f"{final} already exists")
        os.rename(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
