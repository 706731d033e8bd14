"""Where data parallelism plugs into a run; today a run is one process and this is the identity.

A scale-out layer (DDP or FSDP2 under torchrun) replaces :func:`parallelize` and, around it,
the seams named in ``docs/training.md``: the device and process group
(:func:`~elfreg.train.build.build_run`), each rank's slice of a micro-batch
(:func:`~elfreg.train.step.micro_batch`), gradient sync across accumulation
(:func:`~elfreg.train.step.train_step`), and rank-0 logging and sharded checkpoints
(:func:`~elfreg.train.loop.save`, :func:`~elfreg.train.build.resume`).
"""

from __future__ import annotations

from ..config import Config
from ..model.student import Student


def parallelize(student: Student, cfg: Config) -> Student:
    """The student as this process will train it; today ``student`` itself.

    :func:`~elfreg.train.build.build_run` calls it once, after the student is on its device and
    before the optimiser and EMA are built: FSDP2's ``fully_shard`` replaces the parameters by
    sharded ones in place, and the optimiser must be built over those. It must keep the
    ``Student`` methods the objective calls (``fully_shard`` does; a DDP wrapper does not, so
    the objective would run its forward through the wrapper's ``module``).
    """
    return student
