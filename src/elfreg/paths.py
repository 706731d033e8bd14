"""Where elfreg looks for benchmark data and keeps its caches.

Benchmark copies are read from a configurable data directory; nothing is copied into the
repository. Where a benchmark has no local copy, its Hub dataset is read instead
(:mod:`elfreg.eval.tasks.sources`).
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The benchmark data directory.

    Order: explicit ``override`` (``--data-dir``), then ``$ELFREG_DATA_DIR``, then ``data/`` in
    the user cache (:func:`cache_dir`). It never depends on where the package or the current
    directory lies. The returned path may not exist; callers that need it fall back to the Hub,
    raise, or (tests) skip with a clear reason.
    """
    if override is not None:
        return Path(override)
    env = os.environ.get("ELFREG_DATA_DIR")
    if env:
        return Path(env)
    return cache_dir() / "data"


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
