"""A folder locked by another process (:func:`elfreg.runs.locked`) for as long as a test needs it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLD = """
import sys
from elfreg.runs import locked
with locked(sys.argv[1], what=sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes the pipe or kills this process
"""


@contextmanager
def held_lock(folder: Path, what: str = "run folder") -> Iterator[subprocess.Popen]:
    """A child process holding the lock of ``folder`` inside the block (it has taken the lock when
    the block starts); killed with SIGKILL at the end, so the kernel drops the lock."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), what], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()
