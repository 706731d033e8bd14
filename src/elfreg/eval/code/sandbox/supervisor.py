"""Sandbox mechanism: launch one child, enforce its limits, end it, and report what happened.

Contract of :func:`run_in_sandbox` (and :func:`run_many`, its thread-pool form):

* the program runs in a fresh interpreter started by :mod:`elfreg.eval.code.sandbox.boot`, in its own
  session, with stdin ``/dev/null``, the environment of :func:`~.isolation.scrubbed_env` and the
  identity of :func:`~.isolation.run_identity`, in the process's isolation mode
  (:func:`~.isolation.sandbox_isolation`);
* its work directory holds ``program.py`` and the given files and is deleted afterwards;
* the wall clock starts when the boot code reports the isolation ready (setup gets
  ``_SETUP_GRACE_S``); at the limit, at more than ``max_output_bytes`` of stdout+stderr, or when
  the run ends, the whole process group is killed with SIGKILL and, in mode ``none``, every
  process of the run's throwaway uid;
* the CPU, memory, process, file-size and open-file limits are set in the child by the boot
  code from :class:`SandboxLimits`;
* the outcome is a :class:`SandboxResult` whose ``status`` says how the run ended; nothing the
  program does makes these functions raise;
* :func:`run_many` launches no job once its ``should_stop`` says so: the jobs not yet started
  come back as ``not_run`` results (running ones end normally or by their own limits).
"""

from __future__ import annotations

import dataclasses
import math
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from . import isolation

__all__ = ["NOT_RUN", "SandboxLimits", "SandboxResult", "SandboxJob", "run_in_sandbox", "run_many", "run_mode"]

NOT_RUN = "not_run"  #: status of a job that :func:`run_many` did not start because it was told to stop

_BOOT = str(Path(__file__).with_name("boot.py"))
_SETUP_GRACE_S = 15.0
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
    or ``sandbox_error`` (the isolation could not be set up, or the evaluator failed to run it);
    :data:`NOT_RUN` (``not_run``) marks a job of :func:`run_many` that was never started.
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
    mode = isolation.sandbox_isolation()
    try:
        return run_mode(mode, program, timeout, files or {}, args, limits, channel)
    except OSError as err:
        return SandboxResult("sandbox_error", None, "", "", 0.0, f"could not start sandbox: {err}", mode)


def run_many(
    jobs: Sequence[SandboxJob],
    workers: int | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[SandboxResult]:
    """Run many jobs on ``workers`` parallel sandboxes; results come back in input order.

    A job whose worker fails for any reason is returned as a ``sandbox_error`` result with the
    reason; the other results are unaffected. ``progress`` is called with 1 per finished job.
    ``should_stop`` is asked before each job is launched: once it returns true no further
    sandbox starts, and every job not started comes back as a :data:`NOT_RUN` result (not
    counted by ``progress``); jobs already running end as usual.
    """
    workers = max(1, workers or os.cpu_count() or 1)
    results: list[SandboxResult | None] = [None] * len(jobs)
    mode = isolation.sandbox_isolation()
    not_run = SandboxResult(NOT_RUN, None, "", "", 0.0, "not run: the evaluation was stopped", mode)

    def one(job: SandboxJob) -> SandboxResult:
        # asked in the worker, right before launching: a queued job never starts after a stop
        if should_stop is not None and should_stop():
            return not_run
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
            if progress is not None and results[i] is not not_run:
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


def run_mode(
    mode: str,
    program: str,
    timeout: float,
    files: Mapping[str, bytes | str],
    args: Sequence[str],
    limits: SandboxLimits,
    channel: bool,
) -> SandboxResult:
    """One run in the given isolation ``mode`` (:func:`run_in_sandbox` without the mode choice).

    Raises ``OSError`` when the child cannot be started and ``ValueError`` for a file name that
    would leave the work directory.
    """
    host_dir = Path(tempfile.mkdtemp(prefix="elfreg-sbx-"))
    fds: list[int] = []
    identity: isolation.RunIdentity | None = None
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
        workdir = str(host_dir) if mode == "none" else isolation.WORKDIR_NS
        python = isolation.python()
        argv = [python, "-s", "-S", "-B", "-c", _LAUNCHER, os.pathsep.join(isolation.site_dirs()), "program.py"]
        if channel:
            argv.append(str(chan_w))
        argv += [str(a) for a in args]
        identity = isolation.run_identity(mode, limits.nproc)
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
            **identity.boot_settings(),
        }
        _write_config(host_dir / "sandbox.cfg", cfg)
        if mode == "none":
            os.chmod(host_dir, 0o700)
        pass_fds = [status_w] + ([chan_w] if channel else [])
        start = time.monotonic()
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", _BOOT, str(host_dir / "sandbox.cfg")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            env=isolation.scrubbed_env(workdir),
            cwd=str(host_dir),
            start_new_session=True,
        )
        for fd in pass_fds:
            os.close(fd)
            fds.remove(fd)
        return _supervise(proc, identity, start, timeout, limits, status_r, chan_r if channel else -1)
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if identity is not None:
            identity.reap()
        shutil.rmtree(host_dir, ignore_errors=True)


def _supervise(
    proc: subprocess.Popen,
    identity: isolation.RunIdentity,
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
        identity.reap()
    end = time.monotonic()
    duration = end - (ready_at if ready_at is not None else start)
    stdout = bytes(buffers[out_fd]).decode("utf-8", "replace")
    stderr = bytes(buffers[err_fd]).decode("utf-8", "replace")
    status, reason = _classify(returncode, ready_at is not None, timed_out, setup_timeout, over_output,
                               stderr, timeout, limits)
    return SandboxResult(status, returncode, stdout, stderr, duration, reason, identity.mode,
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
