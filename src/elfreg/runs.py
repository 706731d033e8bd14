"""Run folders: the one home of what keeps a long job's output folder safe, identified and resumable.

- :func:`locked` holds an OS file lock (``flock`` on ``<folder>/.lock``) while a job writes into a
  folder (a training run, an evaluation or analysis ``--out``, a study). The kernel releases it on
  any exit, kill -9 included, so a stale lock never blocks a later run. A second process that asks
  for the same folder fails at once with :class:`FolderInUse`, naming the holder's pid.
- :class:`FolderKind` says what one kind of job writes into its folder (its identity file, its
  output files, subfolders of its own kind); :func:`claimed` holds a folder for one job of that
  kind: writable (:func:`check_writable`), locked, and with the job's identity. A fresh folder
  gets the identity; a folder with the same identity is resumed; a folder holding another job's
  results (or results and no identity) is refused with one line naming the first differing key
  (:func:`first_difference`), unless ``overwrite``, which removes what jobs of that kind wrote
  there and nothing else. Identities are written atomically (:func:`write_json_atomic`).
- :class:`GracefulInterrupt` turns the first SIGINT or SIGTERM into a flag the job checks between
  units of work (a training step, a problem); a second signal interrupts at once.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

LOCK_NAME = ".lock"


class FolderInUse(RuntimeError):
    """Another live process holds the folder's lock (exit status 2: choose another folder, or wait)."""

    exit_status = 2


class RunFolderError(ValueError):
    """The folder cannot take this job: it is not writable, or it holds another job's results.
    The message is one line naming the folder and what to do (bad input: exit status 2)."""


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


def check_writable(folder: str | os.PathLike) -> Path:
    """Create ``folder`` (and its parents) and prove it writable by writing and removing a probe,
    so a folder that cannot take the results fails at once, before any model is loaded.

    Raises:
        RunFolderError: the folder cannot be created or written (the message names it).
    """
    folder = Path(folder)
    probe = folder / f".elfreg-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise RunFolderError(f"output folder {folder} is not writable ({err.strerror or err})") from None
    return folder


def first_difference(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first dotted key (in ``new``'s order, then ``old``'s) whose value differs, else ``None``."""
    for key in [*new, *(k for k in old if k not in new)]:
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            inner = first_difference(a, b, f"{prefix}{key}.")
            if inner is not None:
                return inner
        elif key not in old or key not in new or a != b:
            return f"{prefix}{key}"
    return None


def value_at(data: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key, or ``"(absent)"``: what a one-line difference shows."""
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return "(absent)"
        data = data[part]
    return data


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as indented JSON through a temporary file renamed over ``path``: a crash
    leaves the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _read_identity(path: Path) -> dict[str, Any] | None:
    """The identity recorded at ``path``; None when missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _no_subfolders(folder: Path) -> list[Path]:
    return []


@dataclass(frozen=True)
class FolderKind:
    """What one kind of job writes into its output folder.

    ``job`` names the job in messages ("evaluation"); ``identity_file`` holds what determines the
    folder's results; ``outputs`` are the files the job writes (the identity file among them:
    nothing else is ever removed); ``subfolders(folder)`` lists subfolders holding jobs of the same
    kind (an evaluation sweep's points), which are cleared with the folder.
    """

    job: str
    identity_file: str
    outputs: tuple[str, ...]
    subfolders: Callable[[Path], list[Path]] = field(default=_no_subfolders, compare=False)

    @property
    def what(self) -> str:
        return f"{self.job} folder"

    def results(self, folder: Path) -> list[str]:
        """What a job of this kind has left in ``folder`` besides its identity."""
        found = [name for name in self.outputs if name != self.identity_file and (folder / name).exists()]
        return found + [f"{p.name}/" for p in self.subfolders(folder)]

    def clear(self, folder: str | os.PathLike) -> list[str]:
        """Remove what jobs of this kind wrote into ``folder``: :attr:`outputs`, and the same in its
        :attr:`subfolders` (each locked meanwhile; one left empty is removed). Any other file stays.
        Returns the removed paths, relative to ``folder``.

        Raises:
            FolderInUse: another process holds a subfolder.
        """
        folder = Path(folder)
        removed = []
        for name in self.outputs:
            if (folder / name).is_file():
                (folder / name).unlink()
                removed.append(name)
        for sub in self.subfolders(folder):
            with locked(sub, what=self.what):
                removed += [f"{sub.name}/{name}" for name in self.clear(sub)]
            if {p.name for p in sub.iterdir()} <= {LOCK_NAME}:
                shutil.rmtree(sub)
        return removed

    def claim(self, folder: Path, identity: Mapping[str, Any], overwrite: bool) -> bool:
        """Give the (locked) ``folder`` this ``identity``; returns whether an earlier job with the
        same identity is resumed. An identity without results (a job that failed before writing
        any) is simply replaced.

        Raises:
            RunFolderError: the folder holds another job's results and ``overwrite`` is false.
        """
        path = folder / self.identity_file
        old = _read_identity(path)
        if old is not None and first_difference(old, identity) is None:
            return True
        results = self.results(folder)
        if results and not overwrite:
            hint = "rerun with --overwrite to replace its results, or choose another --out"
            if not path.exists():
                raise RunFolderError(f"output folder {folder} holds results of an earlier {self.job} "
                                     f"({', '.join(results)}) but no {self.identity_file}; {hint}")
            if old is None:
                raise RunFolderError(f"output folder {folder} has an unreadable {self.identity_file}; {hint}")
            key = first_difference(old, identity)
            raise RunFolderError(f"output folder {folder} holds another {self.job} ({key}: "
                                 f"{json.dumps(value_at(old, key))} there, {json.dumps(value_at(identity, key))} "
                                 f"now); {hint}")
        if overwrite:
            self.clear(folder)
        write_json_atomic(path, identity)
        return False


@contextmanager
def claimed(folder: str | os.PathLike | None, identity: Mapping[str, Any], kind: FolderKind, *,
            overwrite: bool = False) -> Iterator[bool]:
    """Hold ``folder`` for one job of ``kind``: writable, locked, and with this ``identity``.

    Yields whether an earlier job with the same identity is being resumed (``False`` also when
    ``folder`` is ``None``: nothing is written then).

    Raises:
        RunFolderError: not writable, or used by another job (without ``overwrite``).
        FolderInUse: another process holds the folder.
    """
    if folder is None:
        yield False
        return
    check_writable(folder)
    with locked(folder, what=kind.what):
        yield kind.claim(Path(folder), identity, overwrite)
