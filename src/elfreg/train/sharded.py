"""Checkpoints of ``ddp``/``fsdp2`` runs through ``torch.distributed.checkpoint`` (DCP), and
resuming any run from either checkpoint form at any number of ranks.

- :func:`save_sharded`: every rank writes its shards of the student, the EMA and the optimiser
  state (keyed by parameter name, so independent of how the parameters are split) plus the REG
  statistics, into the temporary folder of :func:`elfreg.checkpoint.write_checkpoint`, which
  rank 0 publishes only when every rank has finished: a rank killed mid-save leaves the previous
  checkpoint as it was.
- :func:`restore`: a sharded checkpoint is loaded straight into this run's (sharded or whole)
  state, DCP resharding it to this run's ranks (2 → 1, 1 → 2, ...); a one-process checkpoint is
  read whole on every rank and handed to the run's state as a full state dict, which shards it.
- :func:`shard_frozen`: ``text.shard_frozen`` under ``fsdp2``: the frozen encoder's and teacher's
  blocks are sharded too, so a large teacher is not replicated on every rank.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..checkpoint import SHARDED, Checkpoint, write_checkpoint
from ..model.presets import student_from_config
from ..text.load import FrozenText
from .optim import make_optimizer

if TYPE_CHECKING:
    from .build import Run


def _state(run: Run) -> dict:
    """This run's state as DCP saves and loads it (model and EMA keyed by parameter name)."""
    opts = [run.optimizer]
    state = {"model": get_model_state_dict(run.student), "ema": run.ema.shadow,
             "optim": get_optimizer_state_dict(run.student, opts)}
    if run.with_teacher:
        teacher = run.frozen.teacher
        state["extra"] = {"reg_mean": teacher.reg_mean.clone(), "reg_std": teacher.reg_std.clone()}
    return state


def save_sharded(run: Run, step: int, meta: dict) -> Path:
    """Checkpoint ``step`` in the sharded form (collective: every rank calls it)."""
    state = _state(run)

    def write(tmp: Path) -> None:
        dcp.save(state, checkpoint_id=str(tmp / SHARDED), no_dist=not run.dist.active)

    return write_checkpoint(run.run_dir, step, run.cfg, meta, write, ranks=run.dist)


def restore(run: Run, ckpt: Checkpoint) -> None:
    """Load ``ckpt`` (either form) into ``run``: weights, EMA, optimiser, REG statistics."""
    opts = [run.optimizer]
    if ckpt.sharded:
        state = _state(run)
        _keep_saved_optimizer_slots(state["optim"]["state"], ckpt.path / SHARDED)
        with warnings.catch_warnings():  # on one process DCP says it assumes one process
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(ckpt.path / SHARDED), no_dist=not run.dist.active)
        set_model_state_dict(run.student, state["model"])
        # strict=False: parameters without saved state (dropped above) are left without state
        set_optimizer_state_dict(run.student, opts, state["optim"], options=StateDictOptions(strict=False))
        extra = state.get("extra")
    else:
        model_sd, optim_sd, ema, extra = _whole_state(run, ckpt)
        full = StateDictOptions(full_state_dict=True)
        set_model_state_dict(run.student, model_sd, options=full)
        # strict=False: parameters the checkpoint holds no optimiser state for are left without
        set_optimizer_state_dict(run.student, opts, optim_sd, options=StateDictOptions(full_state_dict=True,
                                                                                       strict=False))
        run.ema.shadow = {k: _like(ema[k], v) for k, v in run.ema.shadow.items()}
    if run.with_teacher and extra is not None:
        run.frozen.teacher.reg_mean, run.frozen.teacher.reg_std = extra["reg_mean"].cpu(), extra["reg_std"].cpu()


def _keep_saved_optimizer_slots(slots: dict, folder: Path) -> None:
    """Drop from a load template the optimiser state of parameters the checkpoint has none for
    (they never had a gradient, e.g. the decoder head before any decode row): DCP fills a fresh
    optimiser's state for every parameter, and those would otherwise miss in the checkpoint, or
    carry a step count an uninterrupted run does not have."""
    saved = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    prefixes = {".".join(k.split(".")[:-1]) for k in saved if k.startswith("optim.state.")}
    for name in [n for n in slots if not any(p.startswith(f"optim.state.{n}") for p in prefixes)]:
        del slots[name]


def _whole_state(run: Run, ckpt: Checkpoint) -> tuple[dict, dict, dict, dict | None]:
    """A one-process checkpoint as full state dicts keyed by parameter name: rebuilt through a
    whole student and optimiser of the same kind, so the optimiser state is renamed the way DCP
    names it."""
    whole = student_from_config(run.cfg, run.frozen.encoder.width, run.frozen.encoder.vocab_size,
                                run.frozen.teacher.width if run.with_teacher else None)
    whole.load_state_dict(ckpt.model_state())
    opt = make_optimizer(whole, run.cfg.train)
    state = ckpt.train_state()
    opt.load_state_dict(state["optimizer"])
    model_sd, optim_sd = get_state_dict(whole, [opt])
    extra = {k: state[k] for k in ("reg_mean", "reg_std")} if "reg_mean" in state else None
    return model_sd, optim_sd, ckpt.ema_state(), extra


def _like(full: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``current`` is: its shard when ``current`` is a DTensor."""
    full = full.float().to(current.device)
    if hasattr(current, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, current.device_mesh, current.placements)
    return full


def shard_frozen(frozen: FrozenText) -> None:
    """Shard the frozen encoder's and teacher's blocks over the ranks (``text.shard_frozen``):
    each block is gathered for its forward and freed after, as FSDP2 does for the student."""
    from torch.distributed.fsdp import fully_shard

    for model in (frozen.encoder, frozen.teacher):
        if model is None:
            continue
        for layer in model.reader.blocks:
            fully_shard(layer)
        fully_shard(model.reader.base)
