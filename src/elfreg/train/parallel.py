"""Data parallelism: the process group, each rank's device, and the student as it is trained.

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

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..config import Config
from ..model.student import Student

PARALLEL_MODES = ("none", "ddp", "fsdp2")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: its rank, the number of ranks, its rank on the node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the only one that logs, writes metrics and draws progress bars."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Whether a process group is up (the collectives below are then real)."""
        return dist.is_available() and dist.is_initialized()

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over ranks (a new tensor on ``values``' device; the input itself on
        one process). NCCL reduces only GPU tensors, so CPU values travel through this rank's GPU."""
        if not self.active or self.world == 1:
            return values
        out = values.clone()
        if dist.get_backend() == "nccl" and out.device.type != "cuda":
            out = out.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(values.device)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active or self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active and self.world > 1:
            dist.barrier()


def env_dist() -> DistInfo:
    """This process's place as torchrun's environment says (rank 0 of 1 without torchrun)."""
    try:
        return DistInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                        int(os.environ.get("LOCAL_RANK", 0)))
    except ValueError as err:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers ({err})") from None


def rank_device(device: torch.device, info: DistInfo) -> torch.device:
    """The device this rank trains on: ``cuda:LOCAL_RANK`` for a CUDA run, else ``device``."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    return device


def init_distributed(mode: str, device: torch.device) -> DistInfo:
    """Start the process group a ``mode`` run needs (NCCL on CUDA, gloo on CPU) and return this
    process's place. ``none`` under a multi-process torchrun is refused, naming the rank."""
    info = env_dist()
    if mode not in PARALLEL_MODES:
        raise ValueError(f"train.parallel must be one of {', '.join(PARALLEL_MODES)}, got {mode!r}")
    if mode == "none":
        if info.world > 1:
            raise ValueError(f"train.parallel is 'none' but torchrun started {info.world} processes; "
                             "set train.parallel=ddp or train.parallel=fsdp2")
        return info
    if dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), info.local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":  # before the group: its object collectives use the current GPU
        torch.cuda.set_device(device.index if device.index is not None else info.local_rank)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
    else:  # plain `elfreg train` with a ddp/fsdp2 config: a group of one
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistInfo(dist.get_rank(), dist.get_world_size(), info.local_rank)


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
    """
    tc = cfg.train
    student.activation_checkpointing = tc.activation_checkpointing
    if tc.compile:
        for block in student.blocks:
            block.compile()
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


def shutdown_distributed() -> None:
    """End the process group this process started (after a finished run). Every rank meets at a
    barrier first, so no rank tears down its communicator while another still has collectives
    in flight (a gloo rank ended that way can abort)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
