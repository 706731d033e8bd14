"""Continuous batching across denoising steps: the network calls of concurrent samplers merged
into shared calls of one network.

Every row of an elfreg batch carries its own time t, SC-CFG scale w and canvas, so rows at
different points of different trajectories (other samplers, other NFE budgets) can share one
network call. :class:`BatchedNetwork` is a :class:`~elfreg.sampling.network.Network` that many
threads sample through at once, each running the ordinary sampler (:func:`elfreg.sampling.generate`)
unchanged: a ``denoise`` or ``decode`` call from a thread is queued, and one scheduler thread
runs the queued calls of compatible shape together, up to ``max_batch`` rows per network call,
then hands each thread its own rows of the result. A request joins at the next call after it
starts sampling and leaves after its decode; nobody waits for a batch to fill.

Contract:

- a thread's result is its rows of the merged call: the same computation as a call of its rows
  alone, up to the float rounding a different batch shape may bring (``tests/serve/`` checks that
  texts are equal to :func:`~elfreg.sampling.generate`'s and states within 1e-5);
- the scheduler fires when every sampling thread (a session that has made its first call) has a
  call queued, when ``max_batch`` rows are queued, or when the oldest call has waited
  ``linger_s`` since it arrived or since the last network call ended, whichever is later (a
  sampling thread busy elsewhere, encoding its next batch's prompts say, holds the others back
  by at most that); a thread still encoding its first prompts is not waited for;
- calls are merged only when their non-batch shapes agree (canvas length, REG on or off); a
  call of more than ``max_batch`` rows runs in chunks of ``max_batch``;
- :meth:`BatchedNetwork.session` marks a sampling thread; its ``cancel`` event, once set, makes
  the thread's next call raise :class:`RequestCancelled` (its rows never reach the network);
- an exception in a merged call is raised in every thread whose rows were in it;
- the network calls run on one thread, the only one that runs torch's OpenMP team: the
  batcher's own (``own_thread``), or the thread that calls :meth:`BatchedNetwork.run` (the
  server's main thread, which loaded the model). Inside a session a sampling thread's own torch
  work (its sampler's arithmetic, its prompts' encoding) runs on one OpenMP thread: with GNU
  OpenMP every thread that starts a parallel region gets a team of its own, and once more OpenMP
  threads exist than cores its workers stop spinning between regions, so every merged call waits
  on futex wake-ups (a 12-row demo call took 12.4 ms instead of 8.0 ms on a thread of its own
  beside the main thread's team; ``docs/serving.md``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..sampling.network import Network

_openmp: Any = None  # threadpoolctl's controller of the loaded OpenMP runtimes, made on first use


def _one_openmp_thread() -> Any:
    """A context in which this thread's OpenMP parallel regions run on this thread alone
    (OpenMP's thread count is a per-thread setting; torch sets it in each thread at its first
    parallel call, so that call is made first)."""
    global _openmp
    if _openmp is None:
        from threadpoolctl import ThreadpoolController
        _openmp = ThreadpoolController()
    torch.get_num_threads()  # torch's lazy per-thread set-up, which would undo the limit after it
    return _openmp.limit(limits=1, user_api="openmp")


class RequestCancelled(RuntimeError):
    """The request's client went away; its sampling stopped before its next network call."""


@dataclass(eq=False)
class _Call:
    kind: str  # "denoise" or "decode"
    args: tuple[Any, ...]  # the Network method's arguments, batch first where a tensor
    rows: int
    shape_key: tuple
    session: _Session
    queued_at: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class _Session:
    cancel: threading.Event
    sampling: bool = False  # has made its first call: the scheduler waits for its next one
    waiting: bool = False  # has a call queued


@dataclass
class BatchStats:
    """What the scheduler has done so far (read by the server's metrics)."""

    calls: int = 0  # network calls made
    rows: int = 0  # rows over all calls
    merged_calls: int = 0  # sampler calls served (each a thread's call)


def _shape_key(kind: str, args: tuple[Any, ...]) -> tuple:
    """What must agree for two calls to share one: kind, the canvas length, REG present or not."""
    x = args[0]
    optional = args[5:7] if kind == "denoise" else args[2:3]
    return (kind, tuple(x.shape[1:]), x.dtype, tuple(a is None for a in optional))


def _cat(parts: list[Any]) -> Any:
    return None if parts[0] is None else torch.cat(parts)


class BatchedNetwork:
    """A :class:`~elfreg.sampling.network.Network` shared by sampling threads, whose calls are
    merged (module docstring). ``on_call(rows)`` is told the rows of every network call made.
    With ``own_thread`` the scheduler runs in a thread of its own; without, the owner calls
    :meth:`run` on the thread that is to make the network calls."""

    def __init__(self, net: Network, max_batch: int = 32, linger_s: float = 0.02,
                 on_call: Callable[[int], None] | None = None, own_thread: bool = True):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.net = net
        self.reg_dim = net.reg_dim
        self.device = getattr(net, "device", torch.device("cpu"))
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.on_call = on_call
        self.stats = BatchStats()
        self._queue: list[_Call] = []
        self._sessions: set[_Session] = set()
        self._local = threading.local()
        self._cond = threading.Condition()
        self._closed = False
        self._free_since = 0.0  # when the last network call ended
        self._thread = threading.Thread(target=self.run, name="elfreg-batcher", daemon=True) if own_thread else None
        if self._thread is not None:
            self._thread.start()

    # -- what the sampling threads call ---------------------------------------------------------

    @contextmanager
    def session(self, cancel: threading.Event | None = None) -> Iterator[threading.Event]:
        """Mark this thread as sampling through the network until the block ends; yields the
        event that cancels it (``cancel``, or a new one)."""
        s = _Session(cancel or threading.Event())
        self._local.session = s
        with self._cond:
            self._sessions.add(s)
        try:
            with _one_openmp_thread():
                yield s.cancel
        finally:
            self._local.session = None
            with self._cond:
                self._sessions.discard(s)
                self._cond.notify_all()

    @property
    def owns_thread(self) -> bool:
        """Whether the scheduler runs in a thread of its own (else the owner calls :meth:`run`)."""
        return self._thread is not None

    @property
    def queued_calls(self) -> int:
        """Calls waiting for the network."""
        with self._cond:
            return len(self._queue)

    @property
    def active_sessions(self) -> int:
        """Threads sampling through the network (inside :meth:`session`)."""
        with self._cond:
            return len(self._sessions)

    def denoise(self, z: torch.Tensor, q: torch.Tensor, t: torch.Tensor, w: torch.Tensor,
                prompt_mask: torch.Tensor, reg: torch.Tensor | None,
                reg_q: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._submit("denoise", (z, q, t, w, prompt_mask, reg, reg_q))

    def decode(self, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None,
               w: torch.Tensor) -> torch.Tensor:
        return self._submit("decode", (x, prompt_mask, reg, w))

    def close(self) -> None:
        """Stop the scheduler (:meth:`run` returns); calls still queued fail with RuntimeError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _submit(self, kind: str, args: tuple[Any, ...]) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = _Session(threading.Event())  # a caller outside a session is never waited for
        if session.cancel.is_set():
            raise RequestCancelled("the request was cancelled")
        call = _Call(kind, args, args[0].shape[0], _shape_key(kind, args), session)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batched network is closed")
            session.sampling = session.waiting = True
            self._queue.append(call)
            self._cond.notify_all()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    # -- the scheduler ------------------------------------------------------------------------

    def _ready(self, now: float) -> bool:
        if not self._queue:
            return False
        if sum(c.rows for c in self._queue) >= self.max_batch:
            return True
        if all(s.waiting for s in self._sessions if s.sampling):
            return True
        return now - self._waiting_since() >= self.linger_s

    def _waiting_since(self) -> float:
        """Since when the oldest queued call could have run: its arrival, or the end of the last
        network call if that came later (a call that waited for a busy network has not lingered:
        the threads that call just served need a moment to queue their next calls)."""
        return max(self._queue[0].queued_at, self._free_since)

    def _take(self) -> list[_Call]:
        """The oldest call and, in order, every queued call of its shape that still fits."""
        first = self._queue[0]
        taken, rows = [first], first.rows
        for call in self._queue[1:]:
            if call.shape_key == first.shape_key and rows + call.rows <= self.max_batch:
                taken.append(call)
                rows += call.rows
        for call in taken:
            self._queue.remove(call)
            call.session.waiting = False
        return taken

    def run(self) -> None:
        """Make the merged network calls on this thread until :meth:`close`."""
        while True:
            with self._cond:
                while not self._closed and not self._ready(time.monotonic()):
                    timeout = None if not self._queue else max(
                        0.0, self.linger_s - (time.monotonic() - self._waiting_since()))
                    self._cond.wait(timeout)
                if self._closed:
                    for call in self._queue:
                        call.error = RuntimeError("the batched network was closed")
                        call.done.set()
                    self._queue.clear()
                    return
                calls = self._take()
            self._run(calls)
            with self._cond:
                self._free_since = time.monotonic()

    def _run(self, calls: list[_Call]) -> None:
        try:
            outputs = self._merged(calls)
        except BaseException as err:  # noqa: BLE001 - handed to every caller whose rows were in it
            for call in calls:
                call.error = err
                call.done.set()
            return
        start = 0
        for call in calls:
            part = slice(start, start + call.rows)
            call.result = tuple(None if o is None else o[part] for o in outputs) if isinstance(outputs, tuple) \
                else outputs[part]
            start += call.rows
            call.done.set()

    def _merged(self, calls: list[_Call]) -> Any:
        args = tuple(_cat([c.args[i] for c in calls]) for i in range(len(calls[0].args)))
        total = args[0].shape[0]
        method = self.net.denoise if calls[0].kind == "denoise" else self.net.decode
        chunks = []
        for lo in range(0, total, self.max_batch):  # one caller's call may exceed max_batch
            part = tuple(None if a is None else a[lo:lo + self.max_batch] for a in args)
            chunks.append(method(*part))
            rows = part[0].shape[0]
            self.stats.calls += 1
            self.stats.rows += rows
            if self.on_call is not None:
                self.on_call(rows)
        self.stats.merged_calls += len(calls)
        if isinstance(chunks[0], tuple):
            return tuple(_cat([c[i] for c in chunks]) for i in range(len(chunks[0])))
        return torch.cat(chunks)
