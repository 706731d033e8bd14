"""Sandbox isolation policy: what this machine allows, which isolation a run gets, and as whom.

Contract:

* :func:`sandbox_isolation` is the one isolation mode of this process: ``namespaces`` (root:
  mount, network, PID and IPC namespaces and a throwaway uid), ``userns`` (an unprivileged user
  namespace with the same namespaces, capabilities dropped) or ``none`` (resource limits, an own
  session, a scrubbed environment and a private work directory only). It is probed once by
  running a trivial program in each candidate mode and cached; ``$ELFREG_SANDBOX_ISOLATION``
  forces a mode. Falling back to ``none`` warns once; forcing an unavailable mode raises.
* :func:`run_identity` decides who one run is: the throwaway uid/gid (random, never reused in
  practice), the directories to hide from that uid with the interpreter paths bound back, whether
  uid 0 must instead drop its capabilities, and the ``RLIMIT_NPROC`` value. Its
  :meth:`RunIdentity.reap` kills whatever the run's throwaway uid left behind in mode ``none``
  (the namespace modes need no reaping: the kernel ends the PID namespace).
* :func:`scrubbed_env` is the complete environment a sandboxed program starts with.
* :func:`python` and :func:`site_dirs` name the interpreter the child runs and the
  site-packages it may import from.

Nothing here launches a program except the probe, which goes through
:mod:`elfreg.eval.code.sandbox.supervisor` like every other run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import site
import sys
import threading
import time
import warnings
from pathlib import Path

__all__ = [
    "ISOLATION_ENV",
    "MODES",
    "WORKDIR_NS",
    "RunIdentity",
    "kill_uid",
    "python",
    "run_identity",
    "sandbox_isolation",
    "scrubbed_env",
    "site_dirs",
    "user_tasks",
]

log = logging.getLogger(__name__)

ISOLATION_ENV = "ELFREG_SANDBOX_ISOLATION"
MODES = ("namespaces", "userns", "none")
#: the work directory as the program sees it in the namespace modes (on the sandbox's own /tmp)
WORKDIR_NS = "/tmp/job"
_PROBE_TIMEOUT_S = 20.0


# --------------------------------------------------------------------------------------------
# which isolation this machine allows


_isolation_lock = threading.Lock()
_isolation: str | None = None
_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def sandbox_isolation(refresh: bool = False) -> str:
    """The isolation mode used by this process: ``namespaces``, ``userns`` or ``none``.

    Probed once (a trivial program is run in each candidate mode) and cached; ``refresh``
    probes again. ``$ELFREG_SANDBOX_ISOLATION`` forces a mode (or ``auto``). Falling back to
    ``none`` emits one :class:`RuntimeWarning` naming what was tried and why it failed.
    """
    global _isolation
    with _isolation_lock:
        if _isolation is not None and not refresh:
            return _isolation
        wanted = os.environ.get(ISOLATION_ENV, "auto").strip().lower() or "auto"
        if wanted not in (*MODES, "auto"):
            raise ValueError(f"{ISOLATION_ENV}={wanted!r}; expected auto, namespaces, userns or none")
        if wanted == "none":
            _isolation = "none"
            _warn_once(
                f"sandbox: namespaces disabled by {ISOLATION_ENV}=none; untrusted programs run with "
                "resource limits, an own session and a scrubbed environment only (no network or "
                "file-system isolation)"
            )
            return _isolation
        candidates = [wanted] if wanted != "auto" else (
            ["namespaces", "userns"] if os.geteuid() == 0 else ["userns"]
        )
        failures = []
        for mode in candidates:
            why = _probe(mode)
            if why is None:
                _isolation = mode
                return mode
            failures.append(f"{mode}: {why}")
        if wanted != "auto":
            raise RuntimeError(f"sandbox isolation {wanted!r} is not available here: {failures[0]}")
        _isolation = "none"
        _warn_once(
            "sandbox: Linux namespaces are not permitted here ("
            + "; ".join(failures)
            + "); falling back to resource limits, an own session and a scrubbed environment "
            "(no network or file-system isolation)"
        )
        return _isolation


def _probe(mode: str) -> str | None:
    """``None`` when a trivial program runs correctly in ``mode``, else why it did not."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    # Imported here: the supervisor asks this module for every run's identity, and the probe is
    # one such run.
    from .supervisor import SandboxLimits, run_mode

    try:
        res = run_mode(mode, "print('sandbox-ok')", _PROBE_TIMEOUT_S, {}, (), SandboxLimits(), False)
    except OSError as err:
        return str(err)
    if res.status == "ok" and res.stdout.strip() == "sandbox-ok":
        return None
    return res.reason or res.stderr.strip()[-300:] or res.status


# --------------------------------------------------------------------------------------------
# the interpreter the child runs


def site_dirs() -> list[str]:
    """The site-packages directories the sandboxed program may import from (existing ones)."""
    dirs = []
    for d in [*site.getsitepackages(), site.getusersitepackages()]:
        if d and os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def python() -> str:
    """The interpreter the sandbox runs (this one, symbolic links resolved)."""
    return os.path.realpath(sys.executable)


def _hidden_and_exposed() -> tuple[list[str], list[str]]:
    """Ancestors an unprivileged uid cannot traverse, and the interpreter paths under them."""
    needed = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(python()))}
    needed |= {os.path.realpath(p) for p in site_dirs()}
    hidden: set[str] = set()
    exposed: set[str] = set()
    for path in needed:
        parts = Path(path).parts
        for i in range(2, len(parts) + 1):
            ancestor = str(Path(*parts[:i]))
            try:
                mode = os.stat(ancestor).st_mode
            except OSError:
                break
            if not mode & 0o001:
                hidden.add(ancestor)
                exposed.add(path)
                break
    # a needed path inside another exposed path comes along with it (bind mounts are recursive)
    exposed = {p for p in exposed if not any(p != q and p.startswith(q + os.sep) for q in exposed)}
    hidden = {h for h in hidden if not any(h != q and h.startswith(q + os.sep) for q in hidden)}
    return sorted(hidden), sorted(exposed)


_interp_cache: tuple[list[str], list[str]] | None = None


def _interp_paths() -> tuple[list[str], list[str]]:
    global _interp_cache
    if _interp_cache is None:
        _interp_cache = _hidden_and_exposed()
    return _interp_cache


# --------------------------------------------------------------------------------------------
# who one run is


def scrubbed_env(workdir: str) -> dict[str, str]:
    """The whole environment of a sandboxed program: nothing of the evaluator's reaches it."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _throwaway_id() -> int:
    # Drawn from a range no real account uses, so that no other process shares the run's uid.
    return random.SystemRandom().randrange(1_000_000, 2_000_000_000)


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """Who one sandboxed run is, in the terms of the boot code's config.

    ``uid``/``gid`` are the throwaway ids the program runs under (``-1``: it keeps the caller's);
    ``hide`` are directories covered by an empty tmpfs and ``expose`` the interpreter paths bound
    back under them (namespace mode only); ``drop_caps`` keeps uid 0 but drops every capability;
    ``nproc`` is the ``RLIMIT_NPROC`` value.
    """

    mode: str
    uid: int
    gid: int
    nproc: int
    hide: tuple[str, ...] = ()
    expose: tuple[str, ...] = ()
    drop_caps: bool = False

    def boot_settings(self) -> dict[str, object]:
        """The identity's keys of the boot config (unset ones are left out)."""
        out: dict[str, object] = {}
        if self.uid >= 0:
            out.update(uid=self.uid, gid=self.gid)
        if self.mode == "namespaces":
            out.update(hide=list(self.hide), expose=list(self.expose))
        if self.drop_caps:
            out["drop_caps"] = "1"
        out["nproc"] = self.nproc
        return out

    def reap(self) -> None:
        """Kill every process the run's throwaway uid left behind (mode ``none``; idempotent)."""
        if self.mode == "none" and self.uid >= 0:
            kill_uid(self.uid)


def run_identity(mode: str, nproc: int) -> RunIdentity:
    """The identity of one run in ``mode`` that may hold ``nproc`` processes of its own."""
    euid = os.geteuid()
    uid = -1
    hide: tuple[str, ...] = ()
    expose: tuple[str, ...] = ()
    drop_caps = False
    if mode == "namespaces":
        uid = _throwaway_id()
        hidden, exposed = _interp_paths()
        hide, expose = tuple(hidden), tuple(exposed)
    elif mode == "none" and euid == 0:
        if _interp_paths()[0]:  # the interpreter is not reachable by another uid: stay uid 0
            drop_caps = True
        else:
            uid = _throwaway_id()
    if euid != 0 and mode in ("userns", "none"):
        nproc += user_tasks(euid)  # RLIMIT_NPROC counts every process of this user
    return RunIdentity(mode, uid, uid, nproc, hide, expose, drop_caps)


# --------------------------------------------------------------------------------------------
# /proc scans


def _pids() -> list[str]:
    """The process ids in ``/proc`` now."""
    return [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]


def user_tasks(uid: int) -> int:
    """Threads currently owned by ``uid`` (RLIMIT_NPROC counts them all)."""
    total = 0
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/status") as fh:
                text = fh.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 0").split()[0]) == uid:
            total += int(fields.get("Threads", "1").strip() or 1)
    return total


def kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (a throwaway uid used by one run only)."""
    for _ in range(20):
        found = False
        for pid in _pids():
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:
                    continue
                os.kill(int(pid), signal.SIGKILL)
                found = True
            except OSError:
                continue
        if not found:
            return
        time.sleep(0.01)
