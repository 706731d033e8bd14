"""A study plan: what to train and how to evaluate it, read strictly, and the cells it makes.

A plan names a base run config and the axes of the grid::

    base: toy-study-level1.yaml      # a run config file (relative to the plan's folder) or a mapping
    overrides: {eval.limit: 100}     # changes to the base (dotted keys or nested sections)
    models: [elf, repa, elf-reg]     # built-in names (MODEL_PRESETS) or names defined in model_defs
    model_defs: {wide: {model.width: 256}}
    train_seeds: [0, 1, 2]
    samplers: [early-stop, full-span] # built-in names (SAMPLER_PRESETS) or names in sampler_defs
    sampler_defs: {es-rho16: {sampler: early-stop, rho: 16}}
    nfes: [4, 16]
    sample_seeds: [0, 1]
    distill:                         # optional: distil some models' runs (docs/distillation.md)
      config: distill-toy.yaml       # ``elfreg distill``'s YAML (relative to the plan) or a mapping
      overrides: {train.lr: 1.0e-3}  # changes to it, as ``overrides`` changes the base
      models: [elf-reg]              # whose training cells are distilled, every training seed
      samplers: [round, early-stop]  # how each round is scored, at its own N + 1 NFE

A *training cell* is (model, training seed): one run folder. An *evaluation cell* is (training
cell, sampler, NFE, sampling seed): one result row. Cells are listed in a fixed order with stable
ids (``elf-reg/t0`` and ``elf-reg/t0/early-stop/nfe16/s0``). A sampler that removes REG at
inference (``reg: false``) is evaluated only on models trained with the REG token.

With a ``distill`` section, each training cell of a listed model is also distilled (ELF's
progressive distillation, one student per round of ``distill.student_steps``), and a *distilled
cell* is (training cell, round's N, distilled student or its teacher, sampler, sampling seed),
scored at N + 1 NFE: the distilled student beside the model it was distilled from at the same
number of network calls (``elf-reg/t0/distilled-2step/round/nfe3/s0`` and
``elf-reg/t0/teacher/round/nfe3/s0``). The sampler ``round`` is the round's own setting (the
distillation config's ``sample`` section, :func:`elfreg.train.distill.round_config`); any other
is the main grid's sampler at that NFE. Everything here is pure: nothing is trained or written.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from elfreg.config import (
    Config,
    ConfigError,
    SampleConfig,
    apply_override,
    build_dataclass,
    migrated_key,
    read_yaml_mapping,
)
from elfreg.config.migration import migrate

FORMAT_VERSION = 1

# The ablation rows of Table 5 / 37 as changes to the base config. Each sets every switch it is
# about, so a base that changes the defaults cannot leak into a row.
MODEL_PRESETS: dict[str, dict] = {
    "elf": {"model.repa": False, "model.extra_token": "none", "text.repa_shift": 0},
    "repa": {"model.repa": True, "model.extra_token": "none", "text.repa_shift": 0},
    "elf-reg": {"model.repa": True, "model.extra_token": "reg", "text.repa_shift": 0},
    "olt": {"model.repa": True, "model.extra_token": "learned", "text.repa_shift": 0},
    "shift1": {"model.repa": True, "model.extra_token": "reg", "text.repa_shift": 1},
}
# Samplers (Table 4 / 5 / 6 / 30) as changes to the model's ``sample`` section (never ``nfe``).
SAMPLER_PRESETS: dict[str, dict] = {
    "early-stop": {"sampler": "early-stop", "reg": True},
    "full-span": {"sampler": "full-span", "reg": True},
    "renoise": {"sampler": "renoise", "renoise_mode": "both", "reg": True},
    "renoise-schedule": {"sampler": "renoise", "renoise_mode": "schedule", "reg": True},
    "renoise-noise": {"sampler": "renoise", "renoise_mode": "renoise", "reg": True},
    "reg-off": {"sampler": "early-stop", "reg": False},
    "adaptive": {"sampler": "adaptive", "reg": True},
}
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
# Set by the runner for each cell, or by the plan's base for every model: never by one model.
RUNNER_KEYS = ("train.seed", "train.out_dir", "train.progress")
SEED_FIELD = "{train_seed}"
"""In ``train.init_from``, replaced by each training cell's seed: a model that continues another
study's runs starts each of its runs from the run of the same seed (a curriculum)."""


ROUND_SAMPLER = "round"
"""The distilled cells' name for each round's own sampling setting."""


@dataclass
class DistillPlanFile:
    """The plan's ``distill`` section as written; no models, no distillation."""

    config: str | dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)  # changes to config, as the plan's own overrides
    models: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=lambda: [ROUND_SAMPLER, "early-stop"])


@dataclass
class PlanFile:
    """The plan as written (see the module docstring)."""

    base: str | dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    model_defs: dict[str, dict] = field(default_factory=dict)
    train_seeds: list[int] = field(default_factory=lambda: [0])
    samplers: list[str] = field(default_factory=list)
    sampler_defs: dict[str, dict] = field(default_factory=dict)
    nfes: list[int] = field(default_factory=list)
    sample_seeds: list[int] = field(default_factory=lambda: [0])
    distill: DistillPlanFile = field(default_factory=DistillPlanFile)


@dataclass(frozen=True)
class TrainCell:
    model: str
    train_seed: int

    @property
    def id(self) -> str:
        return f"{self.model}/t{self.train_seed}"


@dataclass(frozen=True)
class EvalCell:
    model: str
    train_seed: int
    sampler: str
    nfe: int
    sample_seed: int

    @property
    def train_cell(self) -> TrainCell:
        return TrainCell(self.model, self.train_seed)

    @property
    def id(self) -> str:
        return f"{self.train_cell.id}/{self.sampler}/nfe{self.nfe}/s{self.sample_seed}"


@dataclass(frozen=True)
class DistilledCell:
    """A distilled student (``distilled``) or its teacher, sampled with ``sampler`` at the round's
    ``steps`` + 1 NFE."""

    model: str
    train_seed: int
    steps: int
    distilled: bool
    sampler: str
    sample_seed: int

    @property
    def train_cell(self) -> TrainCell:
        return TrainCell(self.model, self.train_seed)

    @property
    def nfe(self) -> int:
        return self.steps + 1

    @property
    def student(self) -> str:
        return f"distilled-{self.steps}step" if self.distilled else "teacher"

    @property
    def id(self) -> str:
        return f"{self.train_cell.id}/{self.student}/{self.sampler}/nfe{self.nfe}/s{self.sample_seed}"


def merge(data: dict, changes: dict) -> dict:
    """``data`` with ``changes`` applied: keys may be dotted (``model.repa``), nested mappings are
    merged into the sections they name, other values replace."""
    out = copy.deepcopy(data)
    for key, value in changes.items():
        *path, last = str(key).split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config error: {key}: {part} is not a section")
        if isinstance(value, dict) and isinstance(node.get(last), dict):
            node[last] = merge(node[last], value)
        else:
            node[last] = copy.deepcopy(value)
    return out


def _flat(changes: dict, prefix: str = "") -> dict:
    """Dotted keys of every leaf of ``changes``."""
    out = {}
    for key, value in changes.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _prefixed(where: str, err: ConfigError) -> ConfigError:
    text = str(err).removeprefix("config error: ")
    return ConfigError(f"config error: {where}: {text}")


@dataclass
class Study:
    """A checked plan: the resolved run config of every model and the sampler changes."""

    plan: PlanFile
    base: Config
    model_changes: dict[str, dict]
    models: dict[str, Config]
    sampler_changes: dict[str, dict]
    distill: dict | None = None
    """The distillation config as a mapping (its ``train.out_dir`` is set per cell), or None."""
    distill_samplers: dict[str, dict] = field(default_factory=dict)
    distill_steps: list[int] = field(default_factory=list)
    """The student steps N of each distillation round, in order."""

    # -- cells ----------------------------------------------------------------------------
    def applies(self, model: str, sampler: str) -> bool:
        """Whether ``sampler`` is evaluated on ``model`` (REG off only where REG was trained)."""
        cfg = self.models[model]
        return self.sampler_changes[sampler].get("reg", cfg.sample.reg) or cfg.model.extra_token == "reg"

    def train_cells(self) -> list[TrainCell]:
        """Training cells in run order: seed by seed, every model at a seed before the next seed,
        so that a study stopped early still compares every model."""
        return [TrainCell(m, t) for t in self.plan.train_seeds for m in self.plan.models]

    def eval_cells(self, train_cell: TrainCell | None = None) -> list[EvalCell]:
        """Every evaluation cell (of ``train_cell`` only, when given), in run order."""
        cells = [train_cell] if train_cell else self.train_cells()
        return [EvalCell(c.model, c.train_seed, s, n, k) for c in cells for s in self.plan.samplers
                if self.applies(c.model, s) for n in self.plan.nfes for k in self.plan.sample_seeds]

    def distilled_cells(self, train_cell: TrainCell | None = None) -> list[DistilledCell]:
        """Every distilled cell (of ``train_cell`` only, when given), in run order: round by
        round, the teacher's cells before its student's."""
        if self.distill is None:
            return []
        cells = [train_cell] if train_cell else self.train_cells()
        return [DistilledCell(c.model, c.train_seed, n, distilled, s, k) for c in cells
                if c.model in self.plan.distill.models for n in self.distill_steps
                for distilled in (False, True) for s in self.distill_samplers for k in self.plan.sample_seeds]

    # -- settings of one cell -------------------------------------------------------------
    def run_config(self, cell: TrainCell, run_dir: str | Path, progress: bool = True) -> Config:
        """The run config that trains ``cell`` into ``run_dir``."""
        data = self.models[cell.model].to_dict()
        data["train"].update(seed=cell.train_seed, out_dir=str(run_dir), progress=progress)
        if data["train"]["init_from"]:
            data["train"]["init_from"] = data["train"]["init_from"].replace(SEED_FIELD, str(cell.train_seed))
        return Config.from_dict(data)

    def sample_config(self, cell: EvalCell) -> SampleConfig:
        return self.models[cell.model].sample.replace(**self.sampler_changes[cell.sampler], nfe=cell.nfe)

    def distill_config(self, cell: TrainCell, folder: str | Path, progress: bool = True) -> Config:
        """The ``elfreg distill`` config that distils ``cell``'s run into ``folder`` (its rounds'
        parent), with the cell's training seed."""
        from elfreg.train.distill import distill_config

        if self.distill is None:
            raise ValueError("the plan has no distill section")
        return distill_config(self.run_config(cell, "unused", progress), self.distill,
                              [f"train.out_dir={folder}", f"train.seed={cell.train_seed}",
                               f"train.progress={str(progress).lower()}"])

    def distilled_sample_config(self, cell: DistilledCell) -> SampleConfig:
        """``round``: the round's own setting at N + 1 NFE, for the student and its teacher alike;
        another sampler: as the main grid samples the model at that NFE."""
        from elfreg.train.distill import round_config

        if cell.sampler == ROUND_SAMPLER:
            cfg = self.distill_config(cell.train_cell, Path("unused"), False)
            k = cfg.distill.student_steps.index(cell.steps) + 1
            return round_config(cfg, k, cell.steps).sample
        return self.models[cell.model].sample.replace(**self.distill_samplers[cell.sampler], nfe=cell.nfe)

    # -- identity -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The resolved plan, JSON-ready: what every cell is made of (no paths of this run)."""
        models = {name: {"changes": self.model_changes[name], "config": _recorded_config(cfg)}
                  for name, cfg in self.models.items()}
        out = {"format_version": FORMAT_VERSION, "models": models,
               "samplers": {n: self.sampler_changes[n] for n in self.plan.samplers},
               "train_seeds": self.plan.train_seeds, "nfes": self.plan.nfes,
               "sample_seeds": self.plan.sample_seeds}
        if self.distill is not None:  # absent otherwise: a plan without one keeps its identity
            out["distill"] = {"config": distill_settings(self.distill), "models": self.plan.distill.models,
                              "samplers": self.distill_samplers}
        return out

    def identity(self) -> str:
        """A hash of :meth:`to_dict`: two plans with the same identity make the same cells."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _recorded_config(cfg: Config) -> dict:
    """A model's config as a plan records it: without the settings the study sets per cell."""
    data = cfg.to_dict()
    for key in ("seed", "out_dir", "progress"):
        data["train"].pop(key)
    return data


def training_settings(plan: dict) -> dict[str, dict]:
    """What each model's training cells are made of, from a resolved plan (:meth:`Study.to_dict`,
    or the one a folder's ``plan.json`` holds): its config without the ``sample`` section, whose
    settings belong to evaluation cells (each result row records its own). A plan recorded by an
    earlier version has its moved keys put in their current place (:mod:`elfreg.config.migration`);
    a setting or a section the plan does not record (one added to the config since) is at its
    default, which is what the model was trained with."""
    defaults = _recorded_config(Config())
    return {name: {"format_version": plan["format_version"],
                   **{k: {**defaults.get(k, {}), **v} if isinstance(v, dict) else v
                      for k, v in {**defaults, **migrate(m["config"])}.items() if k != "sample"}}
            for name, m in plan["models"].items()}


def distill_settings(distill: dict) -> dict:
    """What a distillation config makes, for the plan's record: the mapping without the settings
    the study sets per cell (``train.out_dir``, ``seed``, ``progress``)."""
    data = copy.deepcopy(distill)
    for key in RUNNER_KEYS:
        section, name = key.split(".")
        (data.get(section) or {}).pop(name, None)
    return data


def sample_settings_match(recorded: dict, now: SampleConfig) -> bool:
    """Whether a row made with the sample settings ``recorded`` is a row of a cell sampled with
    ``now``: every recorded setting is the same now, and a setting the row does not record (one
    added to SampleConfig since) is at its default, which is what the row was made with."""
    current, defaults = asdict(now), asdict(SampleConfig())
    return (all(k in current and current[k] == v for k, v in recorded.items())
            and all(current[k] == defaults[k] for k in current if k not in recorded))


def _check_axes(plan: PlanFile) -> None:
    checks = [
        ("models", bool(plan.models), "must list at least one model"),
        ("samplers", bool(plan.samplers), "must list at least one sampler"),
        ("nfes", bool(plan.nfes), "must list at least one NFE"),
        ("nfes", all(n >= 2 for n in plan.nfes), "every NFE must be >= 2"),
        ("train_seeds", bool(plan.train_seeds) and all(s >= 0 for s in plan.train_seeds),
         "must list seeds >= 0"),
        ("sample_seeds", bool(plan.sample_seeds) and all(s >= 0 for s in plan.sample_seeds),
         "must list seeds >= 0"),
    ]
    for key in ("models", "train_seeds", "samplers", "nfes", "sample_seeds"):
        values = getattr(plan, key)
        checks.append((key, len(set(values)) == len(values), f"lists a value twice: {values}"))
    for key, ok, why in checks:
        if not ok:
            raise ConfigError(f"config error: {key}: {why}")
    for kind, presets in (("model_defs", MODEL_PRESETS), ("sampler_defs", SAMPLER_PRESETS)):
        for name in getattr(plan, kind):
            if not NAME_RE.fullmatch(name):
                raise ConfigError(f"config error: {kind}.{name}: names are lower-case letters, digits, '.', '_', '-'")
            if name in presets:
                raise ConfigError(f"config error: {kind}.{name}: is a built-in name; choose another")


def _lookup(kind: str, names: list[str], defs: dict[str, dict], presets: dict[str, dict]) -> dict[str, dict]:
    known = {**presets, **defs}
    for i, name in enumerate(names):
        if name not in known:
            raise ConfigError(f"config error: {kind}[{i}]: unknown {kind[:-1]} {name!r} "
                              f"(known: {', '.join(known)}; define others in {kind[:-1]}_defs)")
    return {name: _flat(known[name]) for name in names}


def resolve(plan: PlanFile, base_dir: Path) -> Study:
    """Check ``plan`` and resolve every model's run config and every sampler (one-line
    :class:`ConfigError` naming the key at fault)."""
    _check_axes(plan)
    if isinstance(plan.base, str):
        base_data = Config.load(base_dir / plan.base).to_dict()
    else:
        base_data = plan.base
    try:
        base = Config.from_dict(merge(base_data, plan.overrides))
    except ConfigError as err:
        raise _prefixed("base", err) from None
    if base.data.source != "toy-arith":
        raise ConfigError(f"config error: base.data.source: the study scores toy arithmetic; must be toy-arith, "
                          f"got {base.data.source!r}")
    # a model's changes by their keys' current names: a plan may name a key where it used to be
    model_changes = {name: {migrated_key(k): v for k, v in _flat(changes).items()}
                     for name, changes in _lookup("models", plan.models, plan.model_defs, MODEL_PRESETS).items()}
    models = {}
    for name, changes in model_changes.items():
        for key in changes:
            if key in RUNNER_KEYS or key.startswith("eval.") or key == "eval":
                raise ConfigError(f"config error: models.{name}: {key} is set by the study, not by one model")
        try:
            models[name] = Config.from_dict(merge(base.to_dict(), changes))
        except ConfigError as err:
            raise _prefixed(f"models.{name}", err) from None
        init = models[name].train.init_from or ""
        if "{" in init.replace(SEED_FIELD, ""):
            raise ConfigError(f"config error: models.{name}.train.init_from: the only field it may hold is "
                              f"{SEED_FIELD}, got {init!r}")
    sampler_changes = _lookup("samplers", plan.samplers, plan.sampler_defs, SAMPLER_PRESETS)
    for name, changes in sampler_changes.items():
        _check_sampler(name, changes, base)
    study = Study(plan, base, model_changes, models, sampler_changes)
    if plan.distill.models:
        _resolve_distill(study, base_dir)
    return study


def _check_sampler(name: str, changes: dict, base: Config) -> None:
    if "nfe" in changes:
        raise ConfigError(f"config error: sampler_defs.{name}.nfe: the NFE is an axis of the plan (nfes)")
    try:
        build_dataclass(SampleConfig, {**asdict(base.sample), **changes}, prefix="").validate()
    except ConfigError as err:
        raise _prefixed(f"samplers.{name}", err) from None


def _resolve_distill(study: Study, base_dir: Path) -> None:
    """Check the plan's ``distill`` section and set the study's distillation config and samplers."""
    d = study.plan.distill
    for i, name in enumerate(d.models):
        if name not in study.plan.models:
            raise ConfigError(f"config error: distill.models[{i}]: {name!r} is not one of the plan's models")
    for key in ("models", "samplers"):
        values = getattr(d, key)
        if not values or len(set(values)) != len(values):
            raise ConfigError(f"config error: distill.{key}: must list at least one, each once: {values}")
    if not d.config:
        raise ConfigError("config error: distill.config: give elfreg distill's YAML (or its mapping)")
    study.distill = merge(read_yaml_mapping(base_dir / d.config) if isinstance(d.config, str) else d.config,
                          d.overrides)
    known = {**SAMPLER_PRESETS, **study.plan.sampler_defs}
    for i, name in enumerate(d.samplers):
        if name != ROUND_SAMPLER and name not in known:
            raise ConfigError(f"config error: distill.samplers[{i}]: unknown sampler {name!r} (known: "
                              f"{ROUND_SAMPLER}, {', '.join(known)}; define others in sampler_defs)")
    study.distill_samplers = {name: {} if name == ROUND_SAMPLER else _flat(known[name]) for name in d.samplers}
    for name, changes in study.distill_samplers.items():
        _check_sampler(name, changes, study.base)
    for name in d.models:
        try:
            cfg = study.distill_config(TrainCell(name, study.plan.train_seeds[0]), Path("unused"), False)
        except ConfigError as err:
            raise _prefixed(f"distill.config (for {name})", err) from None
        study.distill_steps = list(cfg.distill.student_steps)
    if len(set(study.distill_steps)) != len(study.distill_steps):
        raise ConfigError(f"config error: distill.config: distill.student_steps lists a count twice "
                          f"({study.distill_steps}); each round is scored at its own N + 1 NFE")


def load_plan(path: str | Path, overrides: list[str] | None = None) -> Study:
    """Read a plan file, apply ``key=value`` overrides (``train_seeds=[0]``,
    ``overrides.train.steps=50``) and resolve it (:func:`resolve`)."""
    path = Path(path)
    data = read_yaml_mapping(path)
    for item in overrides or []:
        apply_override(data, item)
    return resolve(build_dataclass(PlanFile, data), path.parent)
