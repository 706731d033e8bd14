"""Build a training run from its config: frozen models, examples, student, optimiser, EMA, RNG.

:func:`start_run` is what ``elfreg train`` does before its first step: open the run folder,
build a :class:`Run`, then either :func:`resume` it from the folder's latest checkpoint or
:func:`calibrate_reg` a fresh one. Every piece is a function of the config alone (seeded), so
a scale-out layer can wrap any step of it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from ..checkpoint import CheckpointError, clean_temporaries, has_checkpoints, open_checkpoint, resolve_checkpoint
from ..config import Config, DataConfig
from ..data.examples import load_examples
from ..device import resolve_device, use_bf16
from ..distributed import DistInfo, init_distributed, rank_device
from ..flow.noising import RowDraws
from ..flow.objective import CountReduce, LossTerms, TrainBatch
from ..jsonl import drop_cut_last_line, read_jsonl, write_jsonl
from ..model.presets import student_from_config
from ..model.student import Student
from ..runs import first_difference, value_at
from ..text.load import FrozenText, load_frozen_text
from .batch import TrainingData, build_canvas, example_indices
from .ema import EMA
from .feature_cache import FeatureCache
from .optim import cosine_steps, make_optimizer
from .parallel import parallelize, wrap_for_training
from .sharded import restore, shard_frozen

REG_CALIBRATION_EXAMPLES = 256


@dataclass(frozen=True)
class Objective:
    """A training objective in place of ELF-REG's (progressive distillation's,
    :mod:`elfreg.train.distill`)."""

    loss: Callable[[Student, TrainBatch, RowDraws, CountReduce | None], LossTerms]
    """The loss of one micro-batch: (the student, this rank's share of the batch, its rows' draws,
    the sum of counts over ranks), called through :attr:`Run.model` as ELF-REG's is."""
    aux_forwards: float
    """Expected forwards of a student-sized network without gradient per example besides the main
    pass (their FLOPs, :func:`~elfreg.train.cost.flops_per_token`)."""


@dataclass
class Run:
    """Everything a training run holds between optimisation steps."""

    cfg: Config
    device: torch.device
    bf16: bool
    frozen: FrozenText
    examples: TrainingData
    student: Student
    optimizer: torch.optim.Optimizer
    ema: EMA
    cache: FeatureCache | None
    model: torch.nn.Module | None = None
    """What a step's forward runs through (:class:`~elfreg.train.parallel.StudentCall`, wrapped
    by DDP or FSDP2); its ``student`` is :attr:`student`."""
    dist: DistInfo = DistInfo()
    kept: dict[int, float] = dataclasses.field(default_factory=dict)
    """Steps whose checkpoints are kept through rotation, and the epoch each is (``train.keep_epochs``)."""
    last_checkpoint: Path | None = None
    """The newest checkpoint this run's state has been saved to or restored from."""
    objective: Objective | None = None
    """The loss a step trains on; None: ELF-REG's (:func:`~elfreg.flow.objective.elf_reg_loss`)."""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What every checkpoint's ``meta.json`` records besides the step and the frozen models
    (a distillation round: its teacher and curriculum)."""

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.train.out_dir)

    @property
    def with_teacher(self) -> bool:
        return self.cfg.needs_teacher


def training_data(cfg: Config) -> TrainingData:
    """What ``cfg.data`` trains on: the shards of ``data.prepared`` (checked against the
    recipe) or, without it, the examples loaded into memory."""
    if cfg.data.prepared:
        from ..data.prepare import open_prepared

        return open_prepared(cfg)
    return load_examples(cfg.data)


def steps_for_epochs(epochs: float, samples: int, global_batch: int) -> int:
    """Optimiser steps of ``epochs`` passes over ``samples`` at ``global_batch`` samples a step."""
    return max(1, math.ceil(epochs * samples / global_batch))


def planned_steps(cfg: Config, examples: int) -> int:
    """The optimiser steps a run of ``cfg`` on ``examples`` examples takes: ``train.steps``, or
    with ``train.epochs`` > 0 :func:`steps_for_epochs` at the global batch ``batch_size·grad_accum``."""
    tc = cfg.train
    return steps_for_epochs(tc.epochs, examples, tc.batch_size * tc.grad_accum) if tc.epochs > 0 else tc.steps


def build_run(cfg: Config, examples: TrainingData | None = None) -> Run:
    """A run at step 0: nothing read from or written to ``train.out_dir``.

    The global RNG is seeded with ``train.seed`` before the student is built, so its initial
    weights depend on the config alone (the same on every rank); the objective's draws are a
    function of (seed, micro-batch, position) (:func:`~elfreg.train.batch.row_draws`).
    ``examples`` defaults to :func:`training_data`. With ``train.epochs`` > 0 the run's config
    gets ``train.steps`` from :func:`steps_for_epochs` (global batch: ``batch_size·grad_accum``).
    Under ``ddp``/``fsdp2`` the process group is started first and the device is this rank's.
    """
    # the data first: a missing or malformed file fails before any model is loaded
    examples = examples if examples is not None else training_data(cfg)
    if not len(examples):
        raise ValueError("no training examples")
    if cfg.train.epochs > 0:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=planned_steps(cfg, len(examples))))
    tc = cfg.train
    info = init_distributed(tc.parallel, resolve_device(tc.device))
    device = rank_device(resolve_device(tc.device), info)
    if tc.batch_size % info.world:
        raise ValueError(f"train.batch_size ({tc.batch_size}) is the global micro-batch and must be divisible "
                         f"by the number of ranks ({info.world})")
    bf16 = use_bf16(device, tc.precision)
    torch.manual_seed(tc.seed)
    with_teacher = cfg.needs_teacher
    frozen = load_frozen_text(cfg.text, with_teacher=with_teacher, device=device, bf16=bf16)
    if cfg.text.shard_frozen:
        shard_frozen(frozen)
    teacher_dim = frozen.teacher.width if with_teacher else None
    student = student_from_config(cfg, frozen.encoder.width, frozen.encoder.vocab_size, teacher_dim).to(device)
    if len(frozen.tokenizer) > student.vocab_size:
        raise ValueError(f"model.vocab_size ({student.vocab_size}) is smaller than the tokenizer's "
                         f"{len(frozen.tokenizer)} tokens: the decoder could not name every target token")
    student = parallelize(student, cfg)
    model = wrap_for_training(student, cfg, device)
    global_batch = tc.batch_size * tc.grad_accum
    kept = {steps_for_epochs(e, len(examples), global_batch): e for e in tc.keep_epochs}
    return Run(cfg=cfg, device=device, bf16=bf16, frozen=frozen, examples=examples, student=student,
               optimizer=make_optimizer(student, tc), ema=EMA(student, tc.ema_decay),
               cache=FeatureCache() if tc.feature_cache else None, model=model, dist=info, kept=kept)


def calibrate_reg(run: Run) -> None:
    """Set the teacher's REG standardisation statistics (ELF-REG §3, App. A) from a fixed draw of up to
    256 training examples (the data order of seed ``train.seed + 1``)."""
    tc = run.cfg.train
    n = len(run.examples)
    calib = example_indices(n, tc.seed + 1, 0, min(REG_CALIBRATION_EXAMPLES, n))
    chunks = [calib[i:i + tc.batch_size] for i in range(0, len(calib), tc.batch_size)]
    teacher = run.frozen.teacher
    teacher.calibrate([build_canvas(run.frozen, run.examples, c, run.device) for c in chunks])
    teacher.reg_mean, teacher.reg_std = run.dist.broadcast((teacher.reg_mean, teacher.reg_std))


def train_state(run: Run) -> dict[str, Any]:
    """What a one-process checkpoint holds besides the weights and EMA: the optimiser and (with a
    teacher) the REG statistics; :func:`resume` restores exactly this. (The objective's draws
    need no state: they are a function of the step.)"""
    state = {"optimizer": run.optimizer.state_dict()}
    if run.with_teacher:
        state.update(reg_mean=run.frozen.teacher.reg_mean, reg_std=run.frozen.teacher.reg_std)
    return state


def resume(run: Run, checkpoint: str | Path) -> int:
    """Restore ``run`` to the state saved in ``checkpoint`` and return the steps it had done.

    Restores student weights, EMA, optimiser and the REG statistics, so that continuing gives
    the losses an uninterrupted run would have. Either checkpoint form (one-process files, or
    the sharded form of a ``ddp``/``fsdp2`` run) resumes any run, at any number of ranks
    (:func:`elfreg.train.sharded.restore`). A checkpoint made with different
    ``text``/``model``/``flow``/``loss``/``data`` settings (where the data's files lie aside), or
    ``train`` settings that set its course (all but :data:`RESUMABLE_TRAIN_CHANGES`), is refused
    (``ValueError``, :func:`course_changes`).
    """
    ckpt = open_checkpoint(checkpoint)
    _check_resumable(run.cfg, ckpt.config)
    if ckpt.sharded or run.cfg.train.parallel != "none":
        restore(run, ckpt)
    else:
        run.student.load_state_dict(ckpt.model_state())
        run.ema.load_state_dict(ckpt.ema_state())
        state = ckpt.train_state()
        run.optimizer.load_state_dict(state["optimizer"])
        if run.with_teacher:
            run.frozen.teacher.reg_mean, run.frozen.teacher.reg_std = state["reg_mean"], state["reg_std"]
    run.last_checkpoint = ckpt.path
    return ckpt.meta["step"]


# train settings a resumed run may change: where and how often it writes, how far it goes, and
# how the same numbers are computed; every other one sets the trajectory the checkpoint is on.
# Under a cosine schedule how far it goes sets the schedule's length too: course_changes checks that
RESUMABLE_TRAIN_CHANGES = frozenset({
    "steps", "decay_steps", "epochs", "out_dir", "ckpt_every", "keep_epochs", "log_every", "device", "feature_cache",
    "host_memory", "progress", "parallel", "activation_checkpointing", "compile", "peak_tflops"})


def _where_data_lives_aside(data: DataConfig) -> DataConfig:
    """``data`` without the paths its rows are read from (a moved folder holds the same rows)."""
    return dataclasses.replace(data, path=None, prepared=None,
                               sources=[dataclasses.replace(s, path="") for s in data.sources])


def course_changes(cfg: Config, saved: Config,
                   sections: tuple[str, ...] = ("text", "model", "flow", "loss", "data"),
                   saved_as: str = "then") -> list[str]:
    """What sets a run configured by ``cfg`` on another course than the run ``saved`` configured,
    one entry per change with both values (``"train.lr: 0.001 then, 0.002 now"``): the first
    differing key of each of ``sections`` (aside from what changes no number: sharding the frozen
    models, where the data's files lie), then every train setting outside
    :data:`RESUMABLE_TRAIN_CHANGES`; ``saved_as`` names ``saved``'s values. Empty: the same course."""
    changes = []
    for section in sections:
        mine, theirs = getattr(cfg, section), getattr(saved, section)
        if section == "text":
            mine, theirs = (dataclasses.replace(c, shard_frozen=False) for c in (mine, theirs))
        elif section == "data":
            mine, theirs = _where_data_lives_aside(mine), _where_data_lives_aside(theirs)
        key = first_difference(dataclasses.asdict(theirs), dataclasses.asdict(mine), f"{section}.")
        if key is not None:
            before, now = (value_at(dataclasses.asdict(c), key.split(".", 1)[1]) for c in (theirs, mine))
            changes.append(f"{key}: {before!r} {saved_as}, {now!r} now")
    # a setting left to its default is the default of the code that runs: a newer elfreg's
    # defaults (ELF's recipe) would otherwise change an older run's schedule without a word
    changes += [f"train.{f.name}: {getattr(saved.train, f.name)!r} {saved_as}, {getattr(cfg.train, f.name)!r} now"
                for f in dataclasses.fields(cfg.train) if f.name not in RESUMABLE_TRAIN_CHANGES
                and getattr(cfg.train, f.name) != getattr(saved.train, f.name)]
    # a cosine run made longer or shorter would leave its schedule at the resumed step
    before, now = cosine_steps(saved.train), cosine_steps(cfg.train)
    if cfg.train.schedule == saved.train.schedule == "cosine" and before != now:
        changes.append(f"the cosine schedule's length: {before} {saved_as}, {now} now (train.decay_steps: "
                       f"{before} goes on at its floor)")
    return changes


def _check_resumable(cfg: Config, saved: Config) -> None:
    changed = course_changes(cfg, saved, saved_as="in the checkpoint")
    if changed:
        raise ValueError(f"resuming would change the run's course ({'; '.join(changed)}); set them as the "
                         "checkpoint has them (its config.yaml) or use a new train.out_dir")


def init_from(run: Run, checkpoint: str | Path) -> None:
    """Start ``run`` from the student weights of ``checkpoint`` (a checkpoint or run folder):
    the EMA starts from them too; optimiser, generator and step stay fresh (step 0). The
    checkpoint's ``model`` and ``loss`` settings and its frozen models must be this run's
    (canvas length and prompt cap may differ)."""
    ckpt = open_checkpoint(checkpoint)
    mine, saved = run.cfg, ckpt.config
    canvas = {"canvas_len": 0, "prompt_cap": 0}
    texts = dataclasses.replace(mine.text, **canvas), dataclasses.replace(saved.text, **canvas)
    for section, a, b in (("model", mine.model, saved.model), ("loss", mine.loss, saved.loss), ("text", *texts)):
        if a != b:
            raise ValueError(f"train.init_from: {ckpt.path} was made with a different '{section}' config")
    # full state dict: FSDP2 shards it into this rank's parameters; a plain student takes it whole
    set_model_state_dict(run.student, ckpt.model_state(), options=StateDictOptions(full_state_dict=True))
    run.ema = EMA(run.student, run.cfg.train.ema_decay)


def start_run(cfg: Config, examples: TrainingData | None = None, resume_existing: bool = True,
              prepare: Callable[[Run], None] | None = None) -> tuple[Run, int]:
    """Open ``train.out_dir`` and return its run and the steps already done. Call it holding the
    folder's lock (:func:`elfreg.runs.locked`; :func:`~elfreg.train.loop.train` does).

    Leftovers of interrupted saves are removed first. A folder holding any checkpoint continues
    from its newest *intact* one, whatever ``checkpoints/latest`` says, and its ``metrics.jsonl``
    is cut back to that step; with ``resume_existing`` false such a folder is refused with
    ``FileExistsError`` before anything is built. Otherwise the run starts at step 0 (from the
    weights of ``train.init_from`` when set) with REG statistics calibrated when a teacher is
    used; ``prepare``, when given, does instead what a fresh run needs before its first step (a
    distillation round: its starting weights and the teacher's REG statistics). The resolved
    config is written to ``config.yaml`` in the folder.

    Under ``ddp``/``fsdp2`` rank 0 alone inspects and writes the folder (it holds the lock) and
    tells every rank which checkpoint to resume from, or the error that stops the run, so that
    every rank resumes the same one or fails with the same line.
    """
    run_dir = Path(cfg.train.out_dir)
    info = init_distributed(cfg.train.parallel, resolve_device(cfg.train.device))
    found: Path | BaseException | None = None
    if info.is_main:
        try:
            found = _open_folder(run_dir, resume_existing)
        except Exception as err:  # every rank raises it below
            found = err
    found = info.broadcast(found)
    if isinstance(found, BaseException):
        raise found
    run = build_run(cfg, examples)
    step = 0
    if found is not None:
        step = resume(run, found)
    elif prepare is not None:
        prepare(run)
    else:
        if cfg.train.init_from:
            init_from(run, cfg.train.init_from)
        if run.with_teacher:
            calibrate_reg(run)
    if info.is_main:
        cut_metrics(run_dir / "metrics.jsonl", step)
        run.cfg.save(run_dir / "config.yaml")
    return run, step


def _open_folder(run_dir: Path, resume_existing: bool) -> Path | None:
    """Clean what interrupted saves left, refuse what must be refused, and return the newest
    intact checkpoint (``None``: a fresh run)."""
    clean_temporaries(run_dir)
    if not resume_existing and has_checkpoints(run_dir):
        raise FileExistsError(f"{run_dir} already holds checkpoints; --fresh refuses to touch it "
                              "(choose a new train.out_dir)")
    existing = resolve_checkpoint(run_dir)
    if existing is None and has_checkpoints(run_dir):
        raise CheckpointError(f"{run_dir} holds checkpoints but none is intact; refusing to start over on "
                              "top of them (move them away or choose a new train.out_dir)")
    run_dir.mkdir(parents=True, exist_ok=True)
    return existing


def cut_metrics(path: Path, step: int) -> None:
    """Drop the ``metrics.jsonl`` lines of steps after ``step`` (a resumed run logs them again);
    the file is replaced atomically."""
    if not path.exists():
        return
    drop_cut_last_line(path)  # a kill -9 during a log write leaves half a line
    keep = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
    write_jsonl(path, keep)
