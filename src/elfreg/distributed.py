"""Multi-process work in one place: where this process stands among torchrun's ranks, the process
group's start and end, and how a failure on one rank reaches the user.

- :func:`env_dist` reads torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (the only place elfreg
  reads them) into a :class:`DistInfo`; ``DistInfo()`` is the one-process stand-in, whose
  collectives return their input.
- :func:`init_distributed` starts the group a training run needs (NCCL on CUDA, gloo on CPU; a
  group of one without torchrun), :func:`join_object_group` the gloo group an evaluation's ranks
  exchange Python objects through; :func:`shutdown_distributed` and :func:`leave_group` end them.
- :func:`rank_prefix` names the rank in each one-line error, and
  :func:`wait_for_the_other_ranks_to_fail` holds a failed rank's exit until the others have
  failed too (or a grace has passed), so every rank's line reaches the user.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .config import PARALLEL_MODES


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
        return DistInfo(int(os.environ.get("RANK", 0) or 0), int(os.environ.get("WORLD_SIZE", 1) or 1),
                        int(os.environ.get("LOCAL_RANK", 0) or 0))
    except ValueError as err:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers ({err})") from None


def rank_device(device: torch.device, info: DistInfo) -> torch.device:
    """The device this rank works on: ``cuda:LOCAL_RANK`` for a CUDA run, else ``device``."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    return device


def init_distributed(mode: str, device: torch.device) -> DistInfo:
    """Start the process group a ``train.parallel`` = ``mode`` run needs (NCCL on CUDA, gloo on
    CPU) and return this process's place. ``none`` under a multi-process torchrun is refused."""
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
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    else:  # plain `elfreg train` with a ddp/fsdp2 config: a group of one
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistInfo(dist.get_rank(), dist.get_world_size(), info.local_rank)


def shutdown_distributed() -> None:
    """End the process group this process started (after a finished run). Every rank meets at a
    barrier first, so no rank tears down its communicator while another still has collectives
    in flight (a gloo rank ended that way can abort)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def join_object_group(timeout: datetime.timedelta = datetime.timedelta(hours=2)) -> DistInfo:
    """Join torchrun's ranks in a gloo group for exchanging Python objects (whatever the device)
    and make this rank's CUDA device current where there is one."""
    info = env_dist()
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timeout)
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank)
    return DistInfo(dist.get_rank(), dist.get_world_size(), info.local_rank)


def leave_group() -> None:
    """Leave the process group without a barrier (every rank, at the end of a command whose
    ranks may already have gone their own ways)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_prefix() -> str:
    """``"rank R/N: "`` in a process that torchrun started with N > 1, so each rank's one line
    says which rank failed; empty otherwise."""
    try:
        info = env_dist()
    except ValueError:
        return ""
    return f"rank {info.rank}/{info.world}: " if info.world > 1 else ""


GRACE_ENV = "ELFREG_RANK_FAILURE_GRACE_S"
DEFAULT_GRACE_S = 10.0


def rank_failure_grace_s() -> float:
    """How long a failed rank waits for the others to fail (:func:`wait_for_the_other_ranks_to_fail`):
    ``$ELFREG_RANK_FAILURE_GRACE_S`` seconds, else 10. A slow shared machine may need more; a test
    of a rank failing alone, less."""
    raw = os.environ.get(GRACE_ENV, "")
    if not raw:
        return DEFAULT_GRACE_S
    try:
        grace = float(raw)
    except ValueError:
        grace = -1.0
    if not grace >= 0:  # also refuses nan
        raise ValueError(f"{GRACE_ENV}={raw!r}: must be a number of seconds >= 0")
    return grace


def _failure_store(timeout_s: float) -> tuple[Any, str] | None:
    """(torchrun's store, this restart's failed-rank counter key), or None outside a torchrun job
    of two or more ranks (or where its store cannot be reached)."""
    try:
        world = env_dist().world
    except ValueError:
        return None
    if world < 2 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=max(timeout_s, 1.0)))
    except (KeyError, ValueError, RuntimeError):
        return None
    return store, f"elfreg/failed-ranks/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def failed_ranks() -> int:
    """How many ranks of this torchrun job have failed so far (0 outside one); a readiness signal
    for tools and tests that must act after another rank's failure."""
    found = _failure_store(DEFAULT_GRACE_S)
    if found is None:
        return 0
    store, key = found
    return int(store.add(key, 0))


def wait_for_the_other_ranks_to_fail(warn: Any = None) -> None:
    """Under torchrun, hold this rank's exit until every rank has failed or the grace
    (:func:`rank_failure_grace_s`) has passed; ``warn(line)`` reports a bad grace setting.

    torchrun stops the remaining ranks as soon as one exits non-zero; a failure every rank meets
    (a bad config value, a missing file) would otherwise reach the user as the line of whichever
    rank got there first, and the slower ranks would be killed before saying theirs. The ranks
    count their failures in torchrun's own store, which exists before (and without) a process
    group. A failure of one rank alone costs the grace before torchrun stops the rest."""
    try:
        grace_s = rank_failure_grace_s()
    except ValueError as err:
        if warn is not None:
            warn(f"warning: {err}; waiting {DEFAULT_GRACE_S:g} s")
        grace_s = DEFAULT_GRACE_S
    found = _failure_store(grace_s)
    if found is None:  # no store to reach: exit at once
        return
    store, key = found
    world = env_dist().world
    try:
        deadline = time.monotonic() + grace_s
        failed = store.add(key, 1)
        while failed < world and time.monotonic() < deadline:
            time.sleep(0.05)
            failed = store.add(key, 0)
    except RuntimeError:  # the store went away (torchrun is stopping the job): exit at once
        return
