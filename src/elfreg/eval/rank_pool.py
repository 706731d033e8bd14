"""``torchrun --nproc_per_node N --no-python elfreg eval --checkpoint DIR ...``: generation
sharded over ranks, results equal to one process's.

Rank 0 runs the evaluation as one process would (it alone holds the output folder, reads and
appends ``predictions.jsonl`` and scores); the other ranks only generate. Generation is cut into
the chunks of :func:`elfreg.eval.generation.evaluate_checkpoint` (whole batches, the batches of
a one-process run), and each round hands one chunk to each rank: a chunk's texts depend only on
its prompts and seeds, never on the rank that made them, so the merged records are those of a
one-process run. Records are appended after each round, so an interrupted run resumes as a
one-process run does (at most one round is lost).

The ranks exchange Python objects only (gloo, whatever the device); generation runs on
``cuda:LOCAL_RANK`` where CUDA is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist

from ..distributed import join_object_group, leave_group
from ..runs import GracefulInterrupt

Job = tuple  # the arguments of elfreg.eval.generation._generate
_STOP = "stop"


class RankPool:
    """Rank 0's handle on every rank: :meth:`map` runs up to ``width`` jobs, one per rank."""

    def __init__(self, run_job: Callable[[Job], Any]):
        self.run_job = run_job
        self.width = dist.get_world_size()

    def map(self, jobs: list[Job]) -> list[Any]:
        if len(jobs) > self.width:
            raise ValueError(f"{len(jobs)} jobs for {self.width} ranks")
        message = [[*jobs, *([None] * (self.width - len(jobs)))]]
        dist.broadcast_object_list(message, src=0)
        results: list[Any] = [None] * self.width
        dist.gather_object(self.run_job(jobs[0]), results, dst=0)
        return results[:len(jobs)]

    def close(self) -> None:
        dist.broadcast_object_list([_STOP], src=0)


def start() -> int:
    """Join the ranks (gloo) and return this rank; the rank's CUDA device is made current."""
    return join_object_group().rank


def serve(run_job: Callable[[Job], Any]) -> None:
    """A rank other than 0: run the job rank 0 hands it each round until it says stop. Signals
    are left to rank 0, which stops every rank at the next round."""
    rank = dist.get_rank()
    with GracefulInterrupt():
        while True:
            message: list[Any] = [None]
            dist.broadcast_object_list(message, src=0)
            if message[0] == _STOP:
                return
            job = message[0][rank]
            dist.gather_object(None if job is None else run_job(job), None, dst=0)


@contextmanager
def pool(run_job: Callable[[Job], Any]) -> Iterator[RankPool]:
    """Rank 0's pool for the life of a command; the other ranks are told to stop on the way
    out, whatever happened."""
    p = RankPool(run_job)
    try:
        yield p
    finally:
        p.close()


def finish() -> None:
    """Leave the process group (every rank, at the end of the command)."""
    leave_group()
