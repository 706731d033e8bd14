"""Continuous batching across denoising steps: the network calls of concurrent requests merged
into shared calls of one network.

Every row of an elfreg batch carries its own time t, SC-CFG scale w and canvas, so rows at
different points of different trajectories (other samplers, other NFE budgets) can share one
network call. :class:`BatchedNetwork` is a :class:`~elfreg.sampling.network.Network` whose
requests are jobs (:meth:`BatchedNetwork.submit`): each runs the ordinary sampler
(:func:`elfreg.sampling.generate`) unchanged, as a greenlet on the scheduler's thread. A job's
``denoise`` or ``decode`` call parks the job; once every job is parked (or done), the scheduler
runs the parked calls of compatible shape together, up to ``max_batch`` rows per network call,
and resumes each job with its own rows of the result. A new job starts before the next call and
leaves after its decode; nobody waits for a batch to fill or for a timer.

Why greenlets and not a thread per request: the samplers' Python work and the network then share
one thread and never contend for the interpreter lock, and torch's OpenMP team is that thread's
alone (with GNU OpenMP every thread that starts a parallel region gets a team of its own, and with
more OpenMP threads than cores the workers stop spinning between regions: a 12-row call of the
demo student took 12.4 ms instead of 8.0 ms beside a second team). Measured in docs/serving.md.

Contract:

- a job's result is its rows of the merged calls: the same computation as calls of its rows
  alone, up to the float rounding a different batch shape may bring (``tests/serve/`` checks that
  texts are equal to :func:`~elfreg.sampling.generate`'s and states within 1e-5);
- calls are merged only when their non-batch shapes agree (canvas length, REG on or off); a
  call of more than ``max_batch`` rows runs in chunks of ``max_batch``; the oldest parked call
  goes first, so no job starves;
- a job's ``cancel`` event, once set, makes its next network call raise :class:`RequestCancelled`
  (its rows never reach the network); a job whose future is cancelled before it starts never
  runs (once started, its future cannot be cancelled);
- a merged call that raises (an out-of-memory error, a row the network cannot take) is run
  again one job at a time, so that only the job at fault fails: the exception of its own call
  is raised in it, and every other job gets its rows as if nothing had happened; a job's own
  exception is its future's; :meth:`BatchedNetwork.close` fails the jobs not yet done;
- the network methods may be called only from a job (a call from anywhere else is a
  ``RuntimeError``), and a job must not block its thread on another job;
- each job, and the thread that runs the scheduler, keeps its own autograd mode: torch keeps
  it per thread, and jobs sharing one thread leave their ``no_grad`` blocks in whatever order
  their calls return, which would otherwise leave the thread's mode to the last one out (a
  trainer in the process that ran :meth:`run` would find gradients off).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import greenlet
import torch

from ..sampling.network import Network


class RequestCancelled(RuntimeError):
    """The request's client went away; its sampling stopped before its next network call."""


class NetworkClosed(RuntimeError):
    """The batched network was closed (the server is stopping): no job starts or calls any more."""


@dataclass(eq=False)
class _Job:
    fn: Callable[[Network], Any]
    cancel: threading.Event
    future: Future = field(default_factory=Future)
    glet: greenlet.greenlet | None = None


@dataclass(eq=False)
class _Call:
    kind: str  # "denoise" or "decode"
    args: tuple[Any, ...]  # the Network method's arguments, batch first where a tensor
    rows: int
    shape_key: tuple
    job: _Job


@dataclass
class BatchStats:
    """What the scheduler has done so far (read by the server's metrics)."""

    calls: int = 0  # network calls made
    rows: int = 0  # rows over all calls
    merged_calls: int = 0  # job calls served
    retried: int = 0  # merged calls that failed and were run again job by job
    seconds: float = 0.0  # spent in network calls


def _shape_key(kind: str, args: tuple[Any, ...]) -> tuple:
    """What must agree for two calls to share one: kind, the canvas length, REG present or not."""
    x = args[0]
    optional = args[5:7] if kind == "denoise" else args[2:3]
    return (kind, tuple(x.shape[1:]), x.dtype, tuple(a is None for a in optional))


def _cat(parts: list[Any]) -> Any:
    return None if parts[0] is None else torch.cat(parts)


class BatchedNetwork:
    """A :class:`~elfreg.sampling.network.Network` shared by jobs whose calls are merged (module
    docstring). ``on_call(rows, seconds)`` is told the rows and duration of every network call,
    ``on_retry()`` every merged call that failed and is run again job by job. With ``own_thread``
    the scheduler runs in a thread of its own; without, the owner calls :meth:`run` on the thread
    that is to make the network calls."""

    def __init__(self, net: Network, max_batch: int = 32, on_call: Callable[[int, float], None] | None = None,
                 own_thread: bool = True, on_retry: Callable[[], None] | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.net = net
        self.reg_dim = net.reg_dim
        self.device = getattr(net, "device", torch.device("cpu"))
        self.max_batch = max_batch
        self.on_call, self.on_retry = on_call, on_retry
        self.stats = BatchStats()
        self._incoming: deque[_Job] = deque()  # submitted, not started (guarded by _cond)
        self._active: dict[greenlet.greenlet, _Job] = {}  # started, not done (scheduler thread only)
        self._parked: list[_Call] = []  # calls waiting for the network (scheduler thread only)
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self.run, name="elfreg-batcher", daemon=True) if own_thread else None
        if self._thread is not None:
            self._thread.start()

    # -- what the owner and the jobs call -----------------------------------------------------

    def submit(self, fn: Callable[[Network], Any], cancel: threading.Event | None = None) -> Future:
        """Run ``fn(self)`` as a job (from any thread); its future holds what it returns or
        raises. ``cancel``, once set, stops the job at its next network call."""
        job = _Job(fn, cancel or threading.Event())
        with self._cond:
            if self._closed:
                raise NetworkClosed("the batched network is closed")
            self._incoming.append(job)
            self._cond.notify_all()
        return job.future

    @property
    def owns_thread(self) -> bool:
        """Whether the scheduler runs in a thread of its own (else the owner calls :meth:`run`)."""
        return self._thread is not None

    @property
    def queued_calls(self) -> int:
        """Calls waiting for the network."""
        return len(self._parked)

    @property
    def active_jobs(self) -> int:
        """Jobs sampling (started and not done)."""
        return len(self._active)

    def denoise(self, z: torch.Tensor, q: torch.Tensor, t: torch.Tensor, w: torch.Tensor,
                prompt_mask: torch.Tensor, reg: torch.Tensor | None,
                reg_q: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._park("denoise", (z, q, t, w, prompt_mask, reg, reg_q))

    def decode(self, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None,
               w: torch.Tensor) -> torch.Tensor:
        return self._park("decode", (x, prompt_mask, reg, w))

    def close(self) -> None:
        """Stop the scheduler (:meth:`run` returns); jobs not yet done fail with :class:`NetworkClosed`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _park(self, kind: str, args: tuple[Any, ...]) -> Any:
        job = self._active.get(greenlet.getcurrent())
        if job is None:
            raise RuntimeError("a BatchedNetwork is called from its jobs only (submit one)")
        if job.cancel.is_set():
            raise RequestCancelled("the request was cancelled")
        if self._closed:
            raise NetworkClosed("the batched network was closed")
        self._parked.append(_Call(kind, args, args[0].shape[0], _shape_key(kind, args), job))
        grad_mode = torch.is_grad_enabled()
        try:
            return job.glet.parent.switch()  # back to the scheduler; it resumes this job with its rows
        finally:
            torch.set_grad_enabled(grad_mode)

    # -- the scheduler ------------------------------------------------------------------------

    def run(self) -> None:
        """Run the jobs and make the merged network calls on this thread until :meth:`close`."""
        while True:
            with self._cond:
                while not self._closed and not self._parked and not self._incoming:
                    self._cond.wait()
                if self._closed:
                    break
                starting, self._incoming = list(self._incoming), deque()
            for job in starting:
                self._start(job)
            if self._parked:
                self._run(self._take())
        self._fail_all(NetworkClosed("the batched network was closed"))

    def _start(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return  # its future was cancelled while it waited: nobody wants the result
        job.glet = greenlet.greenlet(lambda: self._body(job))
        self._active[job.glet] = job
        self._resume(job.glet.switch)  # until its first network call, or its end

    @staticmethod
    def _resume(into_job: Callable[..., Any], *args: Any) -> None:
        """Switch into a job and back, the scheduler's autograd mode as it was (module docstring)."""
        grad_mode = torch.is_grad_enabled()
        try:
            into_job(*args)
        finally:
            torch.set_grad_enabled(grad_mode)

    def _body(self, job: _Job) -> None:
        try:
            result, error = job.fn(self), None
        except BaseException as err:  # noqa: BLE001 - the job's own outcome, handed to its future
            result, error = None, err
        del self._active[job.glet]  # before the future's callbacks run: they may count active jobs
        # a running future cannot be cancelled, so neither call can fail
        if error is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(error)

    def _take(self) -> list[_Call]:
        """The oldest parked call and, in order, every parked call of its shape that still fits."""
        first = self._parked[0]
        taken, rows = [first], first.rows
        for call in self._parked[1:]:
            if call.shape_key == first.shape_key and rows + call.rows <= self.max_batch:
                taken.append(call)
                rows += call.rows
        chosen = set(taken)  # calls compare by identity (eq=False)
        self._parked = [c for c in self._parked if c not in chosen]
        return taken

    def _run(self, calls: list[_Call]) -> None:
        try:
            outputs = self._merged(calls)
        except Exception as err:  # noqa: BLE001 - the job at fault gets it (module docstring)
            if len(calls) == 1:
                self._resume(calls[0].job.glet.throw, type(err), err, err.__traceback__)
                return
            self.stats.retried += 1
            if self.on_retry is not None:
                self.on_retry()
            for call in calls:
                self._run([call])
            return
        start = 0
        for call in calls:
            part = slice(start, start + call.rows)
            start += call.rows
            self._resume(call.job.glet.switch, tuple(None if o is None else o[part] for o in outputs)
                         if isinstance(outputs, tuple) else outputs[part])

    def _merged(self, calls: list[_Call]) -> Any:
        args = tuple(_cat([c.args[i] for c in calls]) for i in range(len(calls[0].args)))
        total = args[0].shape[0]
        method = self.net.denoise if calls[0].kind == "denoise" else self.net.decode
        chunks = []
        for lo in range(0, total, self.max_batch):  # one job's call may exceed max_batch
            part = tuple(None if a is None else a[lo:lo + self.max_batch] for a in args)
            began = time.perf_counter()
            chunks.append(method(*part))
            seconds = time.perf_counter() - began
            rows = part[0].shape[0]
            self.stats.calls += 1
            self.stats.rows += rows
            self.stats.seconds += seconds
            if self.on_call is not None:
                self.on_call(rows, seconds)
        self.stats.merged_calls += len(calls)
        if isinstance(chunks[0], tuple):
            return tuple(_cat([c[i] for c in chunks]) for i in range(len(chunks[0])))
        return torch.cat(chunks)

    def _fail_all(self, err: NetworkClosed) -> None:
        """Fail every job not yet done: those never started, and those parked (each is thrown
        ``err`` at its network call, so its own clean-up runs)."""
        with self._cond:
            waiting, self._incoming = list(self._incoming), deque()
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(err)
        parked, self._parked = self._parked, []
        for call in parked:
            self._resume(call.job.glet.throw, type(err), err, None)
