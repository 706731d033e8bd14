"""Where elfreg looks for benchmark data and keeps its caches.

Benchmark copies are read from a configurable data directory; nothing is copied into the
repository and nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The benchmark data directory.

    Order: explicit ``override``, then ``$ELFREG_DATA_DIR``, then ``../shared/data`` next to the
    current directory, then ``../shared/data`` next to the source checkout. The returned path may
    not exist; callers that need it raise (or tests skip) with a clear reason.
    """
    if override is not None:
        return Path(override)
    env = os.environ.get("ELFREG_DATA_DIR")
    if env:
        return Path(env)
    for base in (Path.cwd(), _REPO_ROOT):
        candidate = (base / ".." / "shared" / "data").resolve()
        if candidate.is_dir():
            return candidate
    return (Path.cwd() / ".." / "shared" / "data").resolve()


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Cache folder for built toy assets (tokenizer, tiny frozen models).

    Order: ``override``, ``$ELFREG_CACHE``, then ``~/.cache/elfreg``.
    """
    if override is not None:
        return Path(override)
    env = os.environ.get("ELFREG_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "elfreg"
