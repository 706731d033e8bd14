"""What keeps a long job's folder safe: an exclusive lock for the life of the process, and
interrupts that stop a job at its next safe point instead of mid-write.

- :func:`locked` holds an OS file lock (``flock`` on ``<folder>/.lock``) while a job writes into a
  folder (a training run, an evaluation ``--out``, a study). The kernel releases it on any exit,
  kill -9 included, so a stale lock never blocks a later run. A second process that asks for the
  same folder fails at once with :class:`FolderInUse`, naming the holder's pid.
- :class:`GracefulInterrupt` turns the first SIGINT or SIGTERM into a flag the job checks between
  units of work (a training step, a problem); a second signal interrupts at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

LOCK_NAME = ".lock"


class FolderInUse(RuntimeError):
    """Another live process holds the folder's lock."""


@contextmanager
def locked(folder: str | Path, what: str = "run folder") -> Iterator[Path]:
    """Hold ``folder``'s lock (creating the folder) until the block ends. A folder this call
    created and the block left holding nothing but its lock (a run that failed before writing)
    is removed again; a folder that holds anything else, or existed before, never is."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if err.errno in (errno.EAGAIN, errno.EACCES):
            raise FolderInUse(f"{what} {folder} is in use by another elfreg process (pid {holder}); "
                              "wait for it to finish or choose another folder") from None
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield folder
    finally:
        if created and [p.name for p in folder.iterdir()] == [LOCK_NAME]:
            (folder / LOCK_NAME).unlink()  # while still holding it
            try:
                folder.rmdir()
            except OSError:  # something arrived meanwhile: keep the folder
                pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class GracefulInterrupt:
    """Within ``with GracefulInterrupt() as stop:``, SIGINT/SIGTERM set ``stop.requested`` (and
    ``stop.signal_name``); a second signal raises KeyboardInterrupt at once. Outside the main
    thread signals cannot be caught, and the block changes nothing."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
