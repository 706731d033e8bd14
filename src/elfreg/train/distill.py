"""``elfreg distill``: ELF's progressive distillation of a trained student into few-step students
(docs/distillation.md).

    elfreg distill --checkpoint TEACHER --config FILE.yaml [--fresh] [section.key=value ...]
    torchrun --nproc_per_node N --no-python elfreg distill ... train.parallel=ddp

TEACHER is an elfreg checkpoint or run folder (trained, or imported from ELF). The distillation's
config is the teacher's network and objective settings (``text``, ``model``, ``flow``, ``loss``,
which FILE may not change) with FILE's ``distill`` and ``train`` sections (``train`` from the
defaults, ELF's recipe, not the teacher's; ``train.out_dir`` is required) and, where FILE gives
them, its ``data``, ``sample`` and ``eval`` (else the teacher's).

Each round of ``distill.student_steps`` is an ordinary run folder, ``train.out_dir/round{k}-{N}step``,
trained for ``train.steps`` (or ``train.epochs``) by the training loop with the distillation
objective (:mod:`elfreg.train.distill_objective`): resumable, torchrun-ready and atomic as
training. Round 1 starts from the teacher's weights (``distill.teacher_weights``; or
``distill.init_from``), round k from round k − 1's (its EMA with ``teacher_weights: ema``, ELF's
warm start), each with a fresh optimiser and an EMA restarted from those weights. The teacher of
every round is the original one, frozen. A finished round is not run again, so running the same
command again resumes the unfinished round; one config per round is a curriculum of one round with
``distill.init_from`` set to the previous round's folder. Every checkpoint's ``meta.json`` says
how it was distilled (``distilled``), its ``config.yaml`` samples at N + 1 NFE
(``distill.round_sampling``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from ..checkpoint import Checkpoint, has_checkpoints, open_checkpoint, resolve_checkpoint
from ..config import (
    Config,
    ConfigError,
    add_progress_flag,
    apply_config_overrides,
    few_step_sampling,
    read_yaml_mapping,
)
from ..distributed import env_dist
from ..flow.distill import draw_distill
from ..host_memory import apply_host_memory
from ..runs import locked
from ..sampling.network import StudentNetwork
from .batch import TrainingData
from .build import Objective, Run, planned_steps, start_run, training_data
from .distill_objective import distill_loss
from .ema import EMA
from .loop import train_loop

TEACHERS = ("text", "model", "flow", "loss")
"""The sections a distillation takes from its teacher: the student is the teacher's network."""


def distill_config(teacher: Config, source: str | Path | dict, overrides: list[str] | None = None) -> Config:
    """The distillation config of FILE ``source`` (or of the mapping it is, as such a file would
    read), with ``section.key=value`` overrides, for a teacher whose config is ``teacher`` (see the
    module docstring); one-line :class:`~elfreg.config.ConfigError` for a section the teacher sets
    or a missing out_dir."""
    given = copy.deepcopy(source) if isinstance(source, dict) else read_yaml_mapping(source)
    apply_config_overrides(given, overrides)
    for section in TEACHERS:
        if section in given:
            raise ConfigError(f"config error: {section}: a distilled student is its teacher's network with its "
                              f"objective; the teacher checkpoint sets {', '.join(TEACHERS)}")
    train = given.get("train") or {}
    if not isinstance(train, dict) or "out_dir" not in train:
        raise ConfigError("config error: train.out_dir: give the folder the rounds are written to")
    if train.get("init_from"):
        raise ConfigError("config error: train.init_from: a distillation starts from its teacher, or from "
                          "distill.init_from")
    merged = teacher.to_dict()
    merged.update({k: given[k] for k in ("data", "eval", "distill") if k in given}, train=train)
    if "sample" in given:
        merged["sample"] = {**merged["sample"], **(given["sample"] or {})}
    return Config.from_dict(merged)


def round_folder(cfg: Config, k: int, steps: int) -> Path:
    """Round ``k``'s run folder (1-based) of an N = ``steps`` student."""
    return Path(cfg.train.out_dir) / f"round{k}-{steps}step"


def round_config(cfg: Config, k: int, steps: int) -> Config:
    """Round ``k``'s run config: ``cfg`` writing into :func:`round_folder`, sampling at steps + 1
    NFE as ``distill.round_sampling`` says."""
    data = cfg.to_dict()
    data["train"]["out_dir"] = str(round_folder(cfg, k, steps))
    sampling = few_step_sampling(steps) if cfg.distill.round_sampling == "elf-pd" else {"nfe": steps + 1}
    data["sample"].update(sampling)
    return Config.from_dict(data)


def round_meta(cfg: Config, k: int, teacher: Checkpoint, start: Path) -> dict[str, Any]:
    """What round ``k``'s checkpoints record of their distillation (``meta.json``'s ``distilled``);
    a round folder resumes only under the same."""
    d = cfg.distill
    steps, sub = d.rounds[k - 1]
    return {"round": k, "student_steps": steps, "teacher_steps": sub, "teacher": str(teacher.path.resolve()),
            "teacher_step": teacher.meta.get("step"), "teacher_weights": d.teacher_weights,
            "started_from": str(start.resolve()), "student_schedule": d.student_schedule,
            "teacher_schedule": d.teacher_schedule}


def teacher_reg_statistics(teacher: Checkpoint) -> tuple[Any, Any]:
    """The REG standardisation statistics the teacher was trained with (its training state): a REG
    student's REG targets are standardised by them in every round."""
    state = teacher.train_state()
    if state.get("reg_mean") is None:
        raise ValueError(f"{teacher.path} holds no REG statistics (a training checkpoint keeps them in its "
                         "training state): distil from the teacher's run folder")
    return state["reg_mean"], state["reg_std"]


def start_round(run: Run, start: Path, teacher: Checkpoint) -> None:
    """A fresh round at step 0: the student and its EMA from ``start``'s weights
    (``distill.teacher_weights``), the REG statistics the teacher's."""
    ckpt = open_checkpoint(start)
    if ckpt.config.model != run.cfg.model:
        raise ValueError(f"{ckpt.path} holds another network than the teacher's: a round starts from the teacher, "
                         "an earlier round or a checkpoint of the teacher's model")
    state = ckpt.ema_state() if run.cfg.distill.teacher_weights == "ema" else ckpt.model_state()
    set_model_state_dict(run.student, state, options=StateDictOptions(full_state_dict=True))
    run.ema = EMA(run.student, run.cfg.train.ema_decay)
    if run.with_teacher:
        run.frozen.teacher.reg_mean, run.frozen.teacher.reg_std = teacher_reg_statistics(teacher)


def round_objective(run: Run, teacher: Checkpoint, steps: int, sub_steps: int) -> Objective:
    """The distillation objective of a round of N = ``steps`` student steps against the frozen
    ``teacher`` (its ``distill.teacher_weights``) taking ``sub_steps`` Euler steps per student step."""
    cfg = run.cfg
    frozen = teacher.load_student(use_ema=cfg.distill.teacher_weights == "ema", device=run.device)
    net = StudentNetwork(frozen.requires_grad_(False), bf16=run.bf16)
    reg_dim = net.reg_dim

    def loss(student, batch, source, reduce_counts):
        draws = draw_distill(tuple(batch.x.shape), reg_dim, sub_steps, cfg.flow, cfg.distill.student_schedule,
                             cfg.distill.teacher_schedule, source)
        return distill_loss(student, net, batch, cfg.flow, cfg.loss, 1.0 / steps, draws, reduce_counts)

    # per example: the self-conditioning call and K steps of the distillation rows
    return Objective(loss, (1 - cfg.flow.decode_prob) * (cfg.flow.sc_prob + sub_steps))


@dataclass
class RoundResult:
    """Where a round of a distillation stands after :func:`distill`."""

    round: int
    student_steps: int
    folder: Path
    step: int
    planned: int
    losses: dict[str, float]

    @property
    def finished(self) -> bool:
        return self.step >= self.planned


def _same_round(folder: Path, meta: dict[str, Any]) -> Checkpoint | None:
    """The newest checkpoint of a round folder, after checking it was distilled as ``meta`` says
    (``ValueError`` naming the first difference); None for a folder without one."""
    found = resolve_checkpoint(folder)
    if found is None:
        return None
    ckpt = open_checkpoint(found)
    theirs = ckpt.meta.get("distilled") or {}
    for key, value in meta.items():
        if theirs.get(key) != value:
            raise ValueError(f"{folder} was distilled with {key} {theirs.get(key)!r}, this distillation's is "
                             f"{value!r}; use a new train.out_dir (or the same settings) to continue")
    return ckpt


def distill(cfg: Config, teacher: str | Path, examples: TrainingData | None = None, resume: bool = True,
            stop_at: int | None = None) -> list[RoundResult]:
    """Run (or resume) every round of ``cfg.distill`` against the checkpoint ``teacher`` (see the
    module docstring); returns each round reached. ``resume=False`` refuses an ``out_dir`` that
    holds any round's checkpoint. ``stop_at`` ends this call after that many steps of the whole
    curriculum (counted over the rounds, with a checkpoint), so that it can run in slices and
    resume exactly. Under torchrun rank 0 holds each round folder's lock."""
    apply_host_memory(cfg.train.host_memory)
    teacher_ckpt = open_checkpoint(teacher)
    for section in TEACHERS:
        mine, theirs = getattr(cfg, section), getattr(teacher_ckpt.config, section)
        if section == "text":  # sharding the frozen models changes no number
            mine, theirs = (dataclasses.replace(c, shard_frozen=False) for c in (mine, theirs))
        if mine != theirs:
            raise ValueError(f"the distillation's '{section}' settings are not its teacher's ({teacher_ckpt.path})")
    folders = [round_folder(cfg, k, n) for k, (n, _) in enumerate(cfg.distill.rounds, start=1)]
    if not resume and any(has_checkpoints(f) for f in folders):
        raise FileExistsError(f"{cfg.train.out_dir} already holds distillation rounds; --fresh refuses to touch "
                              "it (choose a new train.out_dir)")
    examples = examples if examples is not None else training_data(cfg)
    start = Path(cfg.distill.init_from) if cfg.distill.init_from else teacher_ckpt.path
    results, before = [], 0
    for k, ((steps, sub_steps), folder) in enumerate(zip(cfg.distill.rounds, folders, strict=True), start=1):
        rcfg = round_config(cfg, k, steps)
        planned, meta = planned_steps(rcfg, len(examples)), round_meta(cfg, k, teacher_ckpt, start)
        existing = _same_round(folder, meta)
        if existing is not None and existing.meta["step"] >= planned:
            results.append(RoundResult(k, steps, folder, existing.meta["step"], planned, {}))
        elif stop_at is not None and stop_at <= before:
            break
        else:
            with locked(folder) if env_dist().is_main else nullcontext():
                run, step = start_run(rcfg, examples, prepare=lambda run, s=start: start_round(run, s, teacher_ckpt))
                run.meta = {"distilled": meta}
                run.objective = round_objective(run, teacher_ckpt, steps, sub_steps)
                done = train_loop(run, step, None if stop_at is None else stop_at - before)
            results.append(RoundResult(k, steps, folder, done.step, planned, done.last_losses))
            if done.step < planned:
                break
        before += planned
        start = folder
    return results


def run(args: argparse.Namespace) -> int:
    from ..distributed import shutdown_distributed

    teacher = open_checkpoint(args.checkpoint)
    cfg = distill_config(teacher.config, args.config,
                         [*args.override, *(["train.progress=false"] if args.no_progress else [])])
    results = distill(cfg, args.checkpoint, resume=not args.fresh)
    shutdown_distributed()
    if env_dist().is_main:  # under torchrun only rank 0 reports
        for r in results:
            losses = ", ".join(f"{k} {v:.4f}" for k, v in r.losses.items()) or "finished before"
            print(f"round {r.round}: {r.student_steps}-step student at step {r.step} of {r.planned} ({losses}); "
                  f"{r.folder}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distil a trained student into few-step students (ELF's progressive "
                                       "distillation; docs/distillation.md)")
    p.add_argument("--checkpoint", required=True, help="the teacher: a checkpoint or run folder")
    p.add_argument("--config", required=True, help="distillation YAML: distill, train (with out_dir), and "
                                                   "optionally data, sample, eval (see configs/distill-*.yaml)")
    p.add_argument("--fresh", action="store_true",
                   help="refuse an out_dir that holds rounds already (default: resume the unfinished round)")
    add_progress_flag(p)  # as train.progress=false, and the libraries' bars too
    p.add_argument("override", nargs="*", help="key.sub=value overrides, e.g. distill.student_steps=4,2")
    p.set_defaults(func=run)
