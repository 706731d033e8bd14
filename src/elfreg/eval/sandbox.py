"""Run untrusted Python programs in an isolated, resource-limited child process.

Every call of :func:`run_in_sandbox` starts a fresh interpreter in its own session and, where
the kernel allows it, in new mount, network, PID and IPC namespaces:

* **no network**: an empty network namespace (no interface is up, not even loopback);
* **own PID space**: the program cannot see or signal host processes; when the program ends or
  is killed, the namespace's init exits and the kernel kills everything it forked;
* **read-only host file system**: every host mount is re-mounted read-only inside the sandbox;
  a fresh tmpfs on ``/tmp`` holds the throwaway work directory (the program's cwd), ``/dev`` is
  replaced by a minimal one (null, zero, full, random, urandom) and ``/proc`` by a fresh one;
* **unprivileged**: as root the program runs under a random throwaway uid/gid (directories the
  uid could not traverse, such as a ``0700`` home holding the interpreter, are covered by an
  empty tmpfs with only the interpreter's prefix bound back read-only); in a user namespace every
  capability is dropped before ``exec``;
* **limits**: wall clock (the evaluator kills the process group), CPU time (``RLIMIT_CPU``),
  address space (``RLIMIT_AS``), processes (``RLIMIT_NPROC``), file size (``RLIMIT_FSIZE``),
  open files, no core dumps, and at most ``max_output_bytes`` of stdout+stderr;
* **scrubbed environment**: only ``PATH``, ``HOME``/``TMPDIR`` (the work directory), a UTF-8
  locale, ``PYTHONHASHSEED=0`` and single-threaded BLAS settings reach the program.

Isolation is chosen once per process (:func:`sandbox_isolation`): ``namespaces`` when running
as root, else ``userns`` (unprivileged user namespaces), else ``none``; the environment variable
``ELFREG_SANDBOX_ISOLATION`` (``auto``/``namespaces``/``userns``/``none``) overrides the choice.
``none`` keeps the resource limits, the own session, the scrubbed environment and a private
work directory, and drops to a throwaway uid when running as root with an interpreter that uid
can reach; it cannot stop network access or writes to files the uid may write, and says so
once with a :class:`RuntimeWarning`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxJob",
    "run_in_sandbox",
    "run_many",
    "sandbox_isolation",
    "ISOLATION_ENV",
]

log = logging.getLogger(__name__)

ISOLATION_ENV = "ELFREG_SANDBOX_ISOLATION"
_MODES = ("namespaces", "userns", "none")
_BOOT = str(Path(__file__).with_name("_sandbox_boot.py"))
_SETUP_EXIT = 125
_SETUP_GRACE_S = 15.0
_WORKDIR_NS = "/tmp/job"
# Runs inside the sandboxed interpreter: put the work directory and site-packages on sys.path
# (the interpreter starts with -S so that slow .pth hooks are skipped), then run the program.
_LAUNCHER = (
    "import sys,os;"
    "sys.path.insert(0,os.getcwd());"
    "sys.path.extend(p for p in sys.argv[1].split(os.pathsep) if p);"
    "sys.argv=sys.argv[2:];"
    "p=sys.argv[0];g={'__name__':'__main__','__file__':p,'__builtins__':__builtins__};"
    "del sys,os;"
    "exec(compile(open(p,'rb').read(),p,'exec'),g)"
)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (all per run)."""

    memory_mb: int = 2048  #: address-space limit (RLIMIT_AS) of each process
    nproc: int = 64  #: processes/threads the program may hold at once (RLIMIT_NPROC)
    max_output_bytes: int = 1 << 20  #: stdout+stderr beyond this kills the run
    file_mb: int = 64  #: largest file it may write (RLIMIT_FSIZE); also its free space in /tmp
    open_files: int = 256  #: RLIMIT_NOFILE
    max_channel_bytes: int = 256 << 20  #: result-channel bytes kept (harness use)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    ``status`` is one of ``ok`` (exit code 0), ``error`` (non-zero exit, e.g. an uncaught
    exception), ``timeout`` (wall-clock or CPU limit), ``memory`` (``MemoryError``; the
    address-space limit), ``output_limit`` (too much output), ``killed`` (ended by a signal)
    or ``sandbox_error`` (the isolation could not be set up, or the evaluator failed to run it).
    ``reason`` is a one-line human-readable explanation; ``channel`` holds the bytes the program
    wrote to its result channel (used by the test harness; empty otherwise).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration: float
    reason: str
    isolation: str
    channel: bytes = b""

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 within its limits."""
        return self.status == "ok"


@dataclasses.dataclass(frozen=True)
class SandboxJob:
    """Arguments of one :func:`run_in_sandbox` call, for :func:`run_many`."""

    program: str
    timeout: float = 10.0
    files: Mapping[str, bytes | str] | None = None
    args: Sequence[str] = ()
    limits: SandboxLimits = SandboxLimits()
    channel: bool = False


# --------------------------------------------------------------------------------------------
# isolation choice


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
        if wanted not in (*_MODES, "auto"):
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
    if not sys.platform.startswith("linux"):
        return "not Linux"
    try:
        res = _run(mode, "print('sandbox-ok')", 20.0, {}, (), SandboxLimits(), False)
    except OSError as err:
        return str(err)
    if res.status == "ok" and res.stdout.strip() == "sandbox-ok":
        return None
    return res.reason or res.stderr.strip()[-300:] or res.status


# --------------------------------------------------------------------------------------------
# interpreter paths


def _site_dirs() -> list[str]:
    dirs = []
    for d in [*site.getsitepackages(), site.getusersitepackages()]:
        if d and os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def _python() -> str:
    return os.path.realpath(sys.executable)


def _hidden_and_exposed() -> tuple[list[str], list[str]]:
    """Ancestors an unprivileged uid cannot traverse, and the interpreter paths under them."""
    needed = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(_python()))}
    needed |= {os.path.realpath(p) for p in _site_dirs()}
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


def _env(workdir: str) -> dict[str, str]:
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


def _user_tasks(uid: int) -> int:
    """Threads currently owned by ``uid`` (RLIMIT_NPROC counts them all)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as fh:
                text = fh.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 0").split()[0]) == uid:
            total += int(fields.get("Threads", "1").strip() or 1)
    return total


def _kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (a throwaway uid used by one run only)."""
    for _ in range(20):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry.name}").st_uid != uid:
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
                found = True
            except OSError:
                continue
        if not found:
            return
        time.sleep(0.01)


# --------------------------------------------------------------------------------------------
# running


def run_in_sandbox(
    program: str,
    timeout: float = 10.0,
    *,
    files: Mapping[str, bytes | str] | None = None,
    args: Sequence[str] = (),
    limits: SandboxLimits | None = None,
    channel: bool = False,
) -> SandboxResult:
    """Run the Python source ``program`` in a fresh sandboxed interpreter.

    Args:
        program: Python source, run as ``__main__`` in a throwaway work directory (its cwd).
        timeout: wall-clock seconds the program may run (setup time is not counted); the CPU
            limit is the same number of seconds, rounded up.
        files: extra files (name → content) placed in the work directory next to the program.
        args: command-line arguments (``sys.argv[1:]``).
        limits: memory, process, output, file and open-file limits (:class:`SandboxLimits`).
        channel: open a result channel; its file-descriptor number is passed as the first
            argument and whatever the program writes to it is returned as ``channel``.

    Returns:
        A :class:`SandboxResult`. Never raises for anything the program does; a failure of the
        evaluator itself (e.g. no free process slots) is reported as ``sandbox_error``.
    """
    limits = limits or SandboxLimits()
    mode = sandbox_isolation()
    try:
        return _run(mode, program, timeout, files or {}, args, limits, channel)
    except OSError as err:
        return SandboxResult("sandbox_error", None, "", "", 0.0, f"could not start sandbox: {err}", mode)


def run_many(
    jobs: Sequence[SandboxJob],
    workers: int | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[SandboxResult]:
    """Run many jobs on ``workers`` parallel sandboxes; results come back in input order.

    A job whose worker fails for any reason is returned as a ``sandbox_error`` result with the
    reason; the other results are unaffected. ``progress`` is called with 1 per finished job.
    """
    workers = max(1, workers or os.cpu_count() or 1)
    results: list[SandboxResult | None] = [None] * len(jobs)
    mode = sandbox_isolation()

    def one(job: SandboxJob) -> SandboxResult:
        return run_in_sandbox(job.program, job.timeout, files=job.files, args=job.args,
                              limits=job.limits, channel=job.channel)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(one, job): i for i, job in enumerate(jobs)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                results[i] = fut.result()
            except Exception as err:  # noqa: BLE001 - never lose the other results
                results[i] = SandboxResult("sandbox_error", None, "", "", 0.0,
                                           f"worker failed: {type(err).__name__}: {err}", mode)
            if progress is not None:
                progress(1)
    return [r for r in results if r is not None]


def _write_config(path: Path, cfg: Mapping[str, object]) -> None:
    lines = []
    for key, value in cfg.items():
        text = "\x1f".join(value) if isinstance(value, list | tuple) else str(value)
        if "\n" in text or "\t" in key:
            raise ValueError(f"sandbox config value for {key!r} contains a newline")
        lines.append(f"{key}\t{text}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _run(
    mode: str,
    program: str,
    timeout: float,
    files: Mapping[str, bytes | str],
    args: Sequence[str],
    limits: SandboxLimits,
    channel: bool,
) -> SandboxResult:
    host_dir = Path(tempfile.mkdtemp(prefix="elfreg-sbx-"))
    fds: list[int] = []
    uid = -1
    try:
        payload = 0
        for name, content in {**files, "program.py": program}.items():
            if "/" in name or name in ("", ".", "..", "sandbox.cfg"):
                raise ValueError(f"bad sandbox file name {name!r}")
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            (host_dir / name).write_bytes(data)
            payload += len(data)
        status_r, status_w = os.pipe()
        fds += [status_r, status_w]
        chan_r = chan_w = -1
        if channel:
            chan_r, chan_w = os.pipe()
            fds += [chan_r, chan_w]
        workdir = str(host_dir) if mode == "none" else _WORKDIR_NS
        argv = [_python(), "-s", "-S", "-B", "-c", _LAUNCHER, os.pathsep.join(_site_dirs()), "program.py"]
        if channel:
            argv.append(str(chan_w))
        argv += [str(a) for a in args]
        hide, expose = _interp_paths()
        nproc = limits.nproc
        cfg: dict[str, object] = {
            "mode": mode,
            "host_dir": str(host_dir),
            "workdir": workdir,
            "status_fd": status_w,
            "tmpfs_bytes": (limits.file_mb << 20) + payload,
            "cpu_seconds": max(1, math.ceil(timeout)),
            "memory_bytes": limits.memory_mb << 20,
            "file_bytes": limits.file_mb << 20,
            "open_files": limits.open_files,
            "argv": argv,
        }
        euid = os.geteuid()
        if mode == "namespaces":
            uid = random.SystemRandom().randrange(1_000_000, 2_000_000_000)
            cfg.update(uid=uid, gid=uid, hide=hide, expose=expose)
        elif mode == "none" and euid == 0:
            if hide:  # the interpreter is not reachable by another uid: stay uid 0, no capabilities
                cfg["drop_caps"] = "1"
            else:
                uid = random.SystemRandom().randrange(1_000_000, 2_000_000_000)
                cfg.update(uid=uid, gid=uid)
        if euid != 0 and mode in ("userns", "none"):
            nproc += _user_tasks(euid)  # RLIMIT_NPROC counts every process of this user
        cfg["nproc"] = nproc
        _write_config(host_dir / "sandbox.cfg", cfg)
        if mode == "none":
            os.chmod(host_dir, 0o700)
        pass_fds = [status_w] + ([chan_w] if channel else [])
        start = time.monotonic()
        proc = subprocess.Popen(
            [_python(), "-I", "-S", "-B", _BOOT, str(host_dir / "sandbox.cfg")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            env=_env(workdir),
            cwd=str(host_dir),
            start_new_session=True,
        )
        for fd in pass_fds:
            os.close(fd)
            fds.remove(fd)
        return _supervise(proc, mode, uid, start, timeout, limits, status_r, chan_r if channel else -1)
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if mode == "none" and uid >= 0:
            _kill_uid(uid)
        shutil.rmtree(host_dir, ignore_errors=True)


def _supervise(
    proc: subprocess.Popen,
    mode: str,
    uid: int,
    start: float,
    timeout: float,
    limits: SandboxLimits,
    status_r: int,
    chan_r: int,
) -> SandboxResult:
    assert proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray(), chan_r: bytearray()}
    sel.register(out_fd, selectors.EVENT_READ)
    sel.register(err_fd, selectors.EVENT_READ)
    sel.register(status_r, selectors.EVENT_READ)
    if chan_r >= 0:
        sel.register(chan_r, selectors.EVENT_READ)
    ready_at: float | None = None
    exited_at: float | None = None
    timed_out = over_output = setup_timeout = False
    shown = 0
    try:
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (not sel.get_map() or now - exited_at > 1.0):
                break  # done; or stray processes still hold the pipes (possible in mode "none" only)
            deadline = (ready_at + timeout) if ready_at is not None else (start + _SETUP_GRACE_S)
            if now >= deadline:
                timed_out = ready_at is not None
                setup_timeout = ready_at is None
                break
            if not sel.get_map():  # the program closed its outputs but still runs
                time.sleep(min(deadline - now, 0.02))
                continue
            for key, _ in sel.select(min(deadline - now, 0.25)):
                fd = key.fd
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(fd)
                    continue
                if fd == status_r:
                    if ready_at is None:
                        ready_at = time.monotonic()
                elif fd == chan_r:
                    room = limits.max_channel_bytes - len(buffers[fd])
                    buffers[fd] += data[: max(room, 0)]
                else:
                    shown += len(data)
                    room = limits.max_output_bytes - len(buffers[fd])
                    buffers[fd] += data[: max(room, 0)]
                    if shown > limits.max_output_bytes:
                        over_output = True
            if over_output:
                break
    finally:
        _kill_group(proc)
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
        returncode = proc.wait()
        if mode == "none" and uid >= 0:
            _kill_uid(uid)
    end = time.monotonic()
    duration = end - (ready_at if ready_at is not None else start)
    stdout = bytes(buffers[out_fd]).decode("utf-8", "replace")
    stderr = bytes(buffers[err_fd]).decode("utf-8", "replace")
    status, reason = _classify(returncode, ready_at is not None, timed_out, setup_timeout, over_output,
                               stderr, timeout, limits)
    return SandboxResult(status, returncode, stdout, stderr, duration, reason, mode,
                         bytes(buffers[chan_r]) if chan_r >= 0 else b"")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _classify(
    returncode: int,
    ready: bool,
    timed_out: bool,
    setup_timeout: bool,
    over_output: bool,
    stderr: str,
    timeout: float,
    limits: SandboxLimits,
) -> tuple[str, str]:
    if setup_timeout:
        return "sandbox_error", "sandbox setup did not finish"
    if not ready:
        return "sandbox_error", _last_line(stderr) or f"sandbox setup failed (exit {returncode})"
    if over_output:
        return "output_limit", f"output exceeded {limits.max_output_bytes} bytes"
    if timed_out:
        return "timeout", f"wall-clock limit of {timeout:g} s exceeded"
    if returncode == 0:
        return "ok", ""
    sig = returncode - 128 if returncode > 128 else (-returncode if returncode < 0 else 0)
    if sig == signal.SIGXCPU:
        return "timeout", f"CPU time limit of {max(1, math.ceil(timeout))} s exceeded"
    if "MemoryError" in stderr[-2000:]:
        return "memory", f"memory limit of {limits.memory_mb} MiB exceeded (MemoryError)"
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return "killed", f"killed by signal {name}"
    return "error", _last_line(stderr) or f"exit status {returncode}"
