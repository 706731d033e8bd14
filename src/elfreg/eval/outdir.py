"""The output folder of an evaluation (``--out``): what makes a run impossible to lose or mix.

Contract:

* :func:`check_writable` creates the folder and writes and removes a probe file in it, so a
  folder that cannot take the results fails at once, before any model is loaded;
* :func:`claimed` holds the folder's lock (:func:`elfreg.runs.locked`) for the life of a run and
  gives the folder its identity, ``eval_config.json`` (what determines the folder's results):
  a fresh folder gets it; a folder whose identity is the same is resumed; a folder with another
  identity, or with elfreg results and no identity, is refused with one line naming the first
  differing key — unless ``overwrite``, which first removes what elfreg wrote there
  (:func:`clear_outputs`) and nothing else;
* :func:`held` does the same for the folder that holds the subfolders of an NFE/sampler sweep.

Errors are :class:`EvalError` (one line, naming the folder); a folder locked by another process
raises :class:`~elfreg.runs.FolderInUse` (naming the holder's pid).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from elfreg.config import SAMPLERS
from elfreg.runs import LOCK_NAME, locked

__all__ = ["CONFIG_NAME", "OUTPUT_FILES", "PREDICTIONS_NAME", "EvalError", "EvalStopped", "check_writable",
           "claimed", "clear_outputs", "first_difference", "held"]

CONFIG_NAME = "eval_config.json"
PREDICTIONS_NAME = "predictions.jsonl"
#: every file elfreg writes into an output folder (nothing else is ever removed)
OUTPUT_FILES = (PREDICTIONS_NAME, "samples.jsonl", "summary.json", "table.txt", CONFIG_NAME)
#: names of sweep subfolders: ``nfe64``, ``full-span``, ``early-stop-nfe16``
_SWEEP_NAME = re.compile(rf"^(?:(?:{'|'.join(map(re.escape, SAMPLERS))})(?:-nfe\d+)?|nfe\d+)$")
_WHAT = "evaluation folder"


class EvalError(RuntimeError):
    """The evaluation cannot run: a missing checkpoint, an unusable or already used output
    folder, a generator returning the wrong number of outputs. The message is one line."""


class EvalStopped(RuntimeError):
    """The run was stopped by a signal at a safe point; the message says what is saved and how
    to resume."""


def check_writable(folder: str | os.PathLike) -> Path:
    """Create ``folder`` (and its parents) and prove it writable by writing and removing a probe.

    Raises:
        EvalError: the folder cannot be created or written (the message names it).
    """
    folder = Path(folder)
    probe = folder / f".elfreg-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise EvalError(f"output folder {folder} is not writable ({err.strerror or err})") from None
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


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return "(absent)"
        data = data[part]
    return data


def _sweep_folders(folder: Path) -> list[Path]:
    """Subfolders a sweep wrote: named like a sweep point and holding one of elfreg's files."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and _SWEEP_NAME.match(p.name)
                  and any((p / name).is_file() for name in OUTPUT_FILES))


def clear_outputs(folder: str | os.PathLike) -> list[str]:
    """Remove what elfreg wrote into ``folder``: :data:`OUTPUT_FILES` and, in sweep subfolders
    (named like a sweep point, ``nfe64`` or ``full-span-nfe16``, and holding one of those files),
    the same files; a subfolder left empty is removed. Any other file stays. Returns the removed
    paths, relative to ``folder``.

    Raises:
        FolderInUse: another process holds a sweep subfolder's lock.
    """
    folder = Path(folder)
    removed = []
    for name in OUTPUT_FILES:
        if (folder / name).is_file():
            (folder / name).unlink()
            removed.append(name)
    for sub in _sweep_folders(folder):
        with locked(sub, what=_WHAT):
            removed += [f"{sub.name}/{name}" for name in clear_outputs(sub)]
        if {p.name for p in sub.iterdir()} <= {LOCK_NAME}:
            shutil.rmtree(sub)
    return removed


def _read_identity(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_identity(path: Path, identity: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(identity, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # a crash leaves the old identity or the new one, never half of one


def _claim(folder: Path, identity: Mapping[str, Any], overwrite: bool) -> bool:
    """Check ``folder``'s identity against ``identity``; returns whether it is resumed.

    Only a folder holding results is "used": an identity without results (a run that failed
    before writing any, e.g. for missing data) is simply replaced."""
    path = folder / CONFIG_NAME
    hint = "rerun with --overwrite to replace its results, or choose another --out"
    results = [name for name in OUTPUT_FILES if name != CONFIG_NAME and (folder / name).exists()]
    results += [f"{p.name}/" for p in _sweep_folders(folder)]
    old = _read_identity(path) if path.exists() else None
    if old is not None and first_difference(old, identity) is None:
        return True
    if results and not overwrite:
        if not path.exists():
            raise EvalError(f"output folder {folder} holds results of an earlier evaluation ({', '.join(results)}) "
                            f"but no {CONFIG_NAME}; {hint}")
        if old is None:
            raise EvalError(f"output folder {folder} has an unreadable {CONFIG_NAME}; {hint}")
        diff = first_difference(old, identity)
        raise EvalError(f"output folder {folder} holds another evaluation ({diff}: {json.dumps(_lookup(old, diff))} "
                        f"there, {json.dumps(_lookup(identity, diff))} now); {hint}")
    if overwrite:
        clear_outputs(folder)
    _write_identity(path, identity)
    return False


@contextlib.contextmanager
def claimed(folder: str | os.PathLike | None, identity: Mapping[str, Any], *,
            overwrite: bool = False) -> Iterator[bool]:
    """Hold ``folder`` for one evaluation: writable, locked, and with this ``identity``.

    Yields whether an earlier run with the same identity is being resumed (``False`` also when
    ``folder`` is ``None``: nothing is written then).

    Raises:
        EvalError: not writable, or used by another evaluation (without ``overwrite``).
        FolderInUse: another process holds the folder.
    """
    if folder is None:
        yield False
        return
    check_writable(folder)
    with locked(folder, what=_WHAT):
        yield _claim(Path(folder), identity, overwrite)


@contextlib.contextmanager
def held(folder: str | os.PathLike | None, *, overwrite: bool = False) -> Iterator[None]:
    """Hold the parent folder of a sweep: writable and locked; with ``overwrite`` everything
    elfreg wrote there (its sweep subfolders included) is removed first. Each point's subfolder
    is then :func:`claimed` on its own, so points of an earlier sweep with the same settings
    resume and points with other settings are refused."""
    if folder is None:
        yield
        return
    check_writable(folder)
    with locked(folder, what=_WHAT):
        if overwrite:
            clear_outputs(folder)
        yield
