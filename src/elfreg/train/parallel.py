"""Data parallelism: the student as it is trained (the process group and each rank's place are
:mod:`elfreg.distributed`'s).

``train.parallel`` is ``none`` (one process, the student as it is), ``ddp`` (every rank holds the
whole student; gradients are averaged by ``DistributedDataParallel``) or ``fsdp2`` (parameters,
gradients and optimiser state sharded with ``torch.distributed.fsdp.fully_shard``, one unit per
Transformer block plus the root). ``torchrun`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
without it a ``ddp``/``fsdp2`` config runs as a process group of one, so plain ``elfreg train``
is the one-process case of the same code.

The objective calls the student several times per micro-batch (two auxiliary passes without
gradient, the main pass, the decoder head), so the whole loss is computed inside the forward of
:class:`StudentCall`: that is the module DDP and FSDP2 wrap, and every use of every weight
happens inside its forward.

World-size invariance: each rank's loss is its share's sum over the *global* averaging-set sizes
(:func:`elfreg.flow.objective.elf_reg_loss` with ``reduce_counts``), and both wrappers average
gradients over ranks, so :func:`backward_scale` multiplies the loss by the world size: the
averaged gradient is then the global batch's gradient, the one one process computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..compiling import require_compile
from ..config import Config
from ..distributed import DistInfo
from ..model.student import Student


class StudentCall(nn.Module):
    """Runs ``fn(student, *args)`` as its forward, so that a wrapper around it (DDP, FSDP2's root)
    sees every use of the student's weights in a step, whatever ``fn`` calls."""

    def __init__(self, student: Student):
        super().__init__()
        self.student = student

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.student, *args, **kwargs)


def parallelize(student: Student, cfg: Config) -> Student:
    """The student as this process will train it: itself (its parameters sharded in place under
    ``fsdp2``, block by block).

    :func:`~elfreg.train.build.build_run` calls it once, after the student is on its device and
    before the optimiser and EMA are built: ``fully_shard`` replaces the parameters by sharded
    ones in place, and the optimiser must be built over those. Per-block activation
    checkpointing and ``torch.compile`` of the blocks are set here too.

    Compiled blocks take every size as symbolic from the start (``dynamic=True``): the auxiliary
    passes run on a different number of rows each step, which torch's default meets with a first
    kernel for the first row count and a second compile for the others. On the demo's student
    both ways ran as fast (0.86-0.88x an eager step, AVX2 kernels) and gave the same values; a
    compiled run resumed in a new process repeats the uninterrupted one (tested).
    """
    tc = cfg.train
    student.activation_checkpointing = tc.activation_checkpointing
    if tc.compile:
        require_compile("train.compile")
        for block in student.blocks:
            block.compile(dynamic=True)
    if tc.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in student.blocks:
            fully_shard(block)
    return student


def wrap_for_training(student: Student, cfg: Config, device: torch.device) -> nn.Module:
    """The module a step's forward runs through (:class:`StudentCall`): DDP around it under
    ``ddp``, FSDP2's root unit under ``fsdp2`` (the blocks were sharded by :func:`parallelize`)."""
    call = StudentCall(student)
    if cfg.train.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        # some weights sit unused in a micro-batch (the decoder head without decode rows)
        return DistributedDataParallel(call, device_ids=ids, broadcast_buffers=False, find_unused_parameters=True)
    if cfg.train.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(call)
    return call


def backward_scale(cfg: Config, info: DistInfo) -> float:
    """The factor on each rank's loss that turns the wrappers' gradient *average* over ranks into
    the global batch's gradient (see the module docstring)."""
    return float(info.world) if cfg.train.parallel != "none" else 1.0


def no_gradient_sync(model: nn.Module, cfg: Config, last_micro: bool):
    """The context a micro-batch's forward and backward run in: without gradient communication
    on all but the last micro-batch of a step (DDP ``no_sync``; FSDP2 defers its reduce-scatter)."""
    from contextlib import nullcontext

    if last_micro or cfg.train.parallel == "none":
        if cfg.train.parallel == "fsdp2":
            model.set_requires_gradient_sync(True)
        return nullcontext()
    if cfg.train.parallel == "ddp":
        return model.no_sync()
    model.set_requires_gradient_sync(False)
    return nullcontext()

