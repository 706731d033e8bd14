"""The toy LMs' pretraining runs of one asset build (:func:`elfreg.toy.assets.build_toy_assets`)
as they happen: side by side in child processes or one after the other here, saying how far
each has got, and never outliving the build.

Contract:

- :func:`run_side_by_side` runs each build in a spawned child process of its own and returns
  their reports in order; when the build ends any other way (one child fails or dies, a signal,
  any exception) every child still running is stopped (SIGTERM, then SIGKILL) before the
  exception leaves; a child whose parent is killed outright (SIGKILL, where no clean-up can run)
  notices at once, through the pipe multiprocessing keeps to its parent, and exits;
- within :func:`signals_stop_the_build` SIGTERM and SIGINT interrupt the build at once in the
  main thread (:class:`BuildInterrupted`), so that its clean-up runs, whatever handler was
  there (the demo's graceful stop waits for a safe point, which a build does not have); the
  signal then goes on to that handler, so the process still ends as the signal asks (SIGTERM's
  default: exit by the signal, status 143 in a shell);
- :class:`Progress` says, every ``every`` seconds, how many steps each LM has done, the time
  so far and, once every LM has started, about how long is left.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

Say = Callable[[str], None]
STOP_GRACE_S = 10.0  # how long a child gets to end after SIGTERM before it is killed


@dataclass(frozen=True)
class LMJob:
    """One LM to pretrain: ``build(*args, num_threads, before_step)`` returns its report, having
    run on ``num_threads`` torch threads (None: as many as the caller's) and asked
    ``before_step()`` before every step how many to use from then on."""

    name: str
    steps: int
    args: tuple


class BuildInterrupted(KeyboardInterrupt):
    """A signal stopped a toy-asset build (its children are stopped, its temporary folder removed)."""

    def __init__(self, signum: int):
        super().__init__(f"the toy asset build was stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextmanager
def signals_stop_the_build() -> Iterator[None]:
    """SIGTERM and SIGINT interrupt the build within (module docstring); outside the main
    thread, where signals cannot be taken, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise BuildInterrupted(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) is not signal.SIG_IGN}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    try:
        yield
    except BuildInterrupted as err:
        restore()
        signal.raise_signal(err.signum)  # on to the handler from before: SIGTERM's default ends the process
        raise
    finally:
        restore()


class Progress:
    """Step counts of the LMs being pretrained (shared with child processes), said every
    ``every`` seconds while in use as a context manager (module docstring)."""

    def __init__(self, jobs: Sequence[LMJob], say: Say | None, every: float, context: Any):
        self.jobs, self.say, self.every = jobs, say, every
        self.done = [context.Value("i", 0) for _ in jobs]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = time.monotonic()

    def line(self) -> str:
        seconds = time.monotonic() - self._began
        counts = [d.value for d in self.done]
        parts = ", ".join(f"{j.name} {n}/{j.steps} steps" for j, n in zip(self.jobs, counts, strict=True))
        text = f"toy LMs: {parts}; {duration(seconds)} so far"
        if all(counts):  # each LM's own rate, from when the LMs started
            left = max((j.steps - n) * seconds / n for j, n in zip(self.jobs, counts, strict=True))
            text += f", about {duration(left)} left"
        return text

    def __enter__(self) -> Progress:
        if self.say is not None:
            self._thread = threading.Thread(target=self._tell, name="elfreg-toy-progress", daemon=True)
            self._thread.start()
        return self

    def _tell(self) -> None:
        while not self._stop.wait(self.every):
            self.say(self.line())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def duration(seconds: float) -> str:
    """``3 min 05 s`` / ``42 s``."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def run_here(build: Callable[..., dict], jobs: Sequence[LMJob], num_threads: int | None,
             progress: Progress) -> list[dict]:
    """Each build in this process, one after the other, on ``num_threads`` torch threads."""
    import torch

    reports = []
    for job, done in zip(jobs, progress.done, strict=True):
        def before_step(done=done) -> int:
            done.value += 1
            return torch.get_num_threads()
        reports.append(build(*job.args, num_threads, before_step))
    return reports


def run_side_by_side(build: Callable[..., dict], jobs: Sequence[LMJob], num_threads: int,
                     progress: Progress) -> list[dict]:
    """Each build in a spawned child process on ``num_threads`` torch threads; a child that
    finishes hands its CPU to those still running (module docstring)."""
    # spawn, not fork: a forked child would inherit the parent's torch thread pool state
    context = multiprocessing.get_context("spawn")
    freed = context.Event()
    children: list[Any] = []
    pipes = []
    try:
        for job, done in zip(jobs, progress.done, strict=True):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_child, args=(send, build, job.args, num_threads, done, freed),
                                    name=f"elfreg-toy-{job.name}", daemon=True)
            child.start()
            send.close()
            children.append(child)
            pipes.append(receive)
        reports: list[dict | None] = [None] * len(jobs)
        waiting = set(range(len(jobs)))
        while waiting:
            wait([pipes[k] for k in waiting] + [children[k].sentinel for k in waiting])
            for k in sorted(waiting):
                if pipes[k].poll():
                    kind, value = _received(pipes[k], children[k])
                elif children[k].exitcode is not None:
                    kind, value = "error", f"its process ended with status {children[k].exitcode}"
                else:
                    continue
                if kind == "error":
                    raise RuntimeError(f"pretraining the toy {jobs[k].name} failed: {value}")
                reports[k] = value
                waiting.discard(k)
                freed.set()  # the LMs still training take the finished one's CPU
        return reports
    finally:
        for child in children:
            _stop(child)
        for pipe in pipes:
            pipe.close()


def _received(pipe: Any, child: Any) -> tuple[str, Any]:
    try:
        return pipe.recv()
    except EOFError:  # the pipe closed with nothing in it: the child died first
        child.join(STOP_GRACE_S)
        return "error", f"its process ended with status {child.exitcode}"


def _stop(child: Any) -> None:
    if child.is_alive():
        child.terminate()
        child.join(STOP_GRACE_S)
    if child.is_alive():
        child.kill()
    child.join()


def _child(send: Any, build: Callable[..., dict], args: tuple, num_threads: int, done: Any, freed: Any) -> None:
    """A builder process: pretrain one LM on ``num_threads`` threads (twice that once another
    LM has finished) and send back ("ok", report) or ("error", why)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches us too: the parent stops us
    parent = multiprocessing.parent_process()
    if parent is not None:  # its sentinel is ready once the parent is gone, however it ended
        threading.Thread(target=lambda: (wait([parent.sentinel]), os._exit(1)), name="elfreg-parent-watch",
                         daemon=True).start()

    def before_step() -> int:
        done.value += 1
        return num_threads * 2 if freed.is_set() else num_threads

    try:
        report = build(*args, num_threads, before_step)
    except BaseException as err:  # noqa: BLE001 - told to the parent, which raises it there
        send.send(("error", f"{type(err).__name__}: {err}"))
        return
    send.send(("ok", report))
