"""Which code and which files made a result: elfreg's version and, when it runs from a git
checkout, the commit; the SHA-256 of the files a result was read from (:func:`file_sha256`).

Checkpoints (``meta.json``) and study rows carry it, so a number can be traced to the code that
computed it instead of being dated by guesswork.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

from . import __version__


def git_state(folder: Path) -> tuple[str | None, bool | None]:
    """(commit of HEAD, whether tracked files differ from it) of the git checkout holding
    ``folder``; (None, None) outside a checkout or without git."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=20)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str | bool | None]:
    """``{"version", "commit", "dirty"}`` of the elfreg package this process imported: commit and
    dirty are None when it was installed from a wheel (no checkout around it). Read once per
    process."""
    commit, dirty = git_state(Path(__file__).resolve().parent)
    return {"version": __version__, "commit": commit, "dirty": dirty}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
