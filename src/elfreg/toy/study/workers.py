"""Training cells of a study run several at a time, each in its own process (``elfreg study
--jobs N``).

A toy training cell keeps one or two CPU threads busy and no more (its matrices are small), so
on a machine with more cores several cells at once finish the grid sooner than one cell with
every thread. Each worker process runs whole training cells (:func:`.runner.run_cell`: train,
evaluate, distil) on ``threads // jobs`` torch threads, taken in the plan's order. The rows go to
the folder's files as in one process: each row is one line appended with ``O_APPEND`` in one
write, so rows of two workers never interleave. The study folder stays locked by the parent;
each training folder is locked by its worker's trainer. Frozen models that a first use builds
(the toy LMs) are built by the parent before any worker starts.

Signals: the workers run in sessions of their own, so a Ctrl-C reaches the parent alone, which
passes every SIGINT or SIGTERM on to each worker once, as a SIGINT: the first stops each worker
as one process would stop (after a checkpointed step, or after a finished row), a second at once. The
parent then waits for them and raises :class:`~.runner.StudyInterrupted`; the same command
resumes. A cell that fails stops the cells not yet started, the others finish, and the first
error is raised.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from types import FrameType

import torch

from elfreg.plugins import resolve_model_id
from elfreg.progress import silence_library_bars
from elfreg.toy.study.plan import DistilledCell, EvalCell, Study, TrainCell
from elfreg.toy.study.runner import StudyInterrupted, run_cell, run_dir
from elfreg.train.loop import TrainingInterrupted

Work = tuple[TrainCell, list[EvalCell], list[DistilledCell], str]
"""A training cell, its evaluation and distilled cells still to score, and its label ``[k/n]``."""


def _start_worker(threads: int, pids: multiprocessing.Queue) -> None:
    os.setsid()  # out of the terminal's process group: Ctrl-C reaches the parent alone
    silence_library_bars()  # two workers' bars would garble each other: the parent says what ends
    torch.set_num_threads(threads)
    pids.put(os.getpid())


def _cell_in_worker(study: Study, out: Path, work: Work, progress: bool) -> str:
    cell, todo, dtodo, label = work
    if progress:
        print(f"{label} {cell.id}: started (worker {os.getpid()})", file=sys.stderr, flush=True)
    try:
        run_cell(study, out, cell, todo, dtodo, label, progress=False)
    except (TrainingInterrupted, StudyInterrupted) as err:  # one picklable kind crosses back
        raise StudyInterrupted(f"{cell.id}: {err}") from None
    return cell.id


def run_in_processes(study: Study, out: Path, work: list[Work], jobs: int, progress: bool) -> None:
    """Run ``work`` (in order) ``jobs`` training cells at a time in worker processes; return when
    all are done, or raise the first interruption or error once the running ones have stopped."""
    for cell in dict.fromkeys(w[0] for w in work):  # frozen models a first use builds: built once, here
        text = study.run_config(cell, run_dir(out, cell), progress).text
        for model_id in (text.encoder, text.teacher, text.tokenizer):
            resolve_model_id(model_id)
    threads = max(1, torch.get_num_threads() // jobs)
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch's threads
    pids: multiprocessing.Queue = context.Queue()
    sent: dict[int, int] = {}  # worker pid -> how many of the signals it has been sent
    signalled: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        signalled.append(signum)  # passed on from the loop below: no queue work inside a handler

    def pass_on() -> None:
        while True:
            try:
                sent.setdefault(pids.get_nowait(), 0)
            except queue.Empty:
                break
        for pid, told in sent.items():
            for _ in signalled[told:]:
                try:  # SIGINT for either: a worker between a trainer's and a scorer's handlers stops at once
                    os.kill(pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
            sent[pid] = len(signalled)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    errors: list[BaseException] = []
    try:
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker,
                                 initargs=(threads, pids)) as pool:
            pending: dict[Future, Work] = {pool.submit(_cell_in_worker, study, out, w, progress): w for w in work}
            done_count = 0
            while pending:
                finished, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                pass_on()
                for future in finished:
                    cell, _, _, label = pending.pop(future)
                    if future.cancelled():
                        continue
                    error = future.exception()
                    if error is None:
                        done_count += 1
                        if progress:
                            print(f"{label} {cell.id}: done ({done_count} of {len(work)} training cells, "
                                  f"{jobs} at a time)", file=sys.stderr, flush=True)
                        continue
                    errors.append(error)
                    for other in pending:  # those not started yet; the running ones finish
                        other.cancel()
                if signalled:
                    for other in pending:
                        other.cancel()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        pids.close()
        pids.join_thread()
    if signalled:
        where = "; ".join(str(e) for e in errors if isinstance(e, StudyInterrupted))
        raise StudyInterrupted(f"interrupted by {signal.Signals(signalled[0]).name}"
                               + (f" ({where})" if where else "") + "; run the same command to resume")
    if errors:
        raise errors[0]
