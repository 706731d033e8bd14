"""Every setting of an elfreg run, as dataclasses with YAML load/save and strict validation.

The dataclass defaults are the paper's settings (ELF-REG §3 and App. A–C): its frozen models, ELF-B's
student, its objective and samplers, and ELF's training recipe, which the paper trains with (Muon,
global batch 512, lr 2e-3 = ELF's blr 1e-3 × 512 / 256, constant after 5,000 warmup steps, EMA
0.9999); only a run's length (``train.steps`` / ``train.epochs``) is every run's own. The files in
``configs/`` and the toy demo's presets set what they change, the toy recipes all of their own
optimisation settings.
Validation errors are one line naming the offending key, e.g.
``config error: train.lr: expected float, got 'fast'`` (parsing and flags: :mod:`elfreg.config.strict`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..device import check_device_name
from .data import BENCHMARKS, PAPER_RECIPES, TEMPLATES, DataConfig, FilterConfig, SourceConfig
from .distill import DISTILL_SCHEDULES, DistillConfig
from .migration import migrate, migrated_key
from .strict import (
    ConfigError,
    add_config_flags,
    apply_override,
    build_dataclass,
    config_flag_values,
    read_yaml_mapping,
)

__all__ = [  # with the parsing helpers of .strict: elfreg.config re-exports every name listed here
    "BENCHMARKS", "DISTILL_SCHEDULES", "FULL_SPAN_GRIDS", "MODEL_SIZES", "PAPER_RECIPES", "PARALLEL_MODES", "SAMPLERS",
    "SAMPLING_PRESETS", "TEMPLATES",
    "Config", "ConfigError", "DataConfig", "DistillConfig", "EvalConfig", "ExtraToken",
    "FilterConfig", "FlowConfig", "LossConfig", "ModelConfig", "SampleConfig", "SourceConfig", "TextConfig",
    "TrainConfig", "add_config_flags", "apply_config_overrides", "apply_override", "build_dataclass",
    "config_flag_values", "few_step_sampling", "migrated_key", "needs_teacher",
]


@dataclass
class TextConfig:
    """Frozen text models and the canvas (ELF-REG §3.1; the T5 encoder and global standardisation
    are ELF's, docs/elf.md)."""

    encoder: str = "Qwen/Qwen3-0.6B-Base"  # hub id or local folder: a causal LM, or a T5 encoder (ELF's)
    encoder_revision: str | None = None
    encoder_layer: int = 20  # hidden_states index: output of the 20th block; -1: the model's output (T5)
    standardize: Literal["token", "global"] = "token"  # token: each state by its own mean/std; global: ELF's
    latent_mean: float = 0.0  # global standardisation: (h - latent_mean) / latent_std
    latent_std: float = 1.0
    teacher: str | None = "Qwen/Qwen3-1.7B-Base"  # None: no teacher (plain ELF only)
    teacher_revision: str | None = None
    repa_layer: int = 20
    reg_layer: int = 24
    repa_shift: int = 0  # 0: teacher position i; 1: teacher position i-1 (ablation)
    tokenizer: str | None = None  # default: the encoder's folder / id
    shard_frozen: bool = False  # fsdp2: shard the frozen encoder/teacher over ranks too (no replica per rank)
    canvas_len: int = 1024
    prompt_cap: int = 256  # 256 for math, 512 for code
    # which end of a prompt longer than prompt_cap is cut: left keeps its last tokens (the question
    # ends elfreg's templates), right its first (ELF's conditional tasks)
    prompt_truncation: Literal["left", "right"] = "left"
    answer_cap: int = 0  # a sampled answer is read from at most this many tokens (0: all; ELF's gen_length)


ExtraToken = Literal["reg", "learned", "none"]
# Named student sizes, the one place they are written: ELF's ELF-B and ELF-L (its ELF_B and
# ELF_L; ELF-L's 16 heads of 80) with the block ELF-REG's REPA aligns (§3.2). A config names one
# as ``model.size``; ModelConfig's defaults are ELF-B's.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "elf-b": {"width": 768, "depth": 12, "heads": 12, "repa_block": 4},
    "elf-l": {"width": 1280, "depth": 32, "heads": 16, "repa_block": 8},
}
_B = MODEL_SIZES["elf-b"]


@dataclass
class ModelConfig:
    """The student's shape: ELF's network (docs/elf.md) with the REPA projector and the extra token
    of ELF-REG (arXiv 2609.29102 §3): every part whose weights a checkpoint holds.
    ``mlp_hidden`` 0 means floor(8·width/3), ELF's SwiGLU width for its MLP ratio 4. ``size``
    names one of :data:`MODEL_SIZES`, whose width, depth, heads and REPA block a config then
    need not give (and may not contradict)."""

    size: str | None = None
    width: int = _B["width"]
    depth: int = _B["depth"]
    heads: int = _B["heads"]
    mlp_hidden: int = 0
    vocab_size: int = 0  # the decoder's vocabulary; 0: the encoder's (ELF sizes it by its tokenizer: imports set it)
    bottleneck: int = 128  # input path: [z ; q] -> encoder width -> bottleneck -> width (ELF's text_proj)
    time_tokens: int = 4  # learned prefix tokens of the time t
    cfg_tokens: int = 4  # ... of the SC-CFG scale w (0: w is not an input; imported ELF models only)
    mode_tokens: int = 4  # ... of the decode mode (gated 1 on decode rows, 0 on denoise rows)
    time_freq_dim: int = 256  # sinusoidal features of t and w
    bias: bool = True  # biases of the attention and MLP projections (ELF's qkv_bias and SwiGLU)
    dropout: float = 0.0  # on attention outputs and SwiGLU hidden states of the middle half of the blocks
    repa: bool = True  # the REPA projector p_φ (training only; Table 5's ablations turn it off)
    extra_token: ExtraToken = "reg"  # reg: the REG token; learned: one learnable token (OLT); none
    repa_block: int = _B["repa_block"]  # 1-based: REPA aligns the output of this block
    projector_hidden: int = 2048
    rope_base: float = 10000.0

    @classmethod
    def of_size(cls, size: str, **changes: Any) -> ModelConfig:
        """The model of a named size (:data:`MODEL_SIZES`) with ``changes`` (not to its sizes)."""
        return cls(**sized({**changes, "size": size}))

    @property
    def needs_teacher(self) -> bool:
        """Whether this student has teacher-width parts (:func:`needs_teacher`)."""
        return needs_teacher(self.repa, self.extra_token)


def sized(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model`` section with its named ``size`` filled in (:data:`MODEL_SIZES`): what the size
    fixes is filled where the section is silent, and refused where it says otherwise."""
    size = model.get("size")
    if size is None:
        return model
    if size not in MODEL_SIZES:
        raise ConfigError(f"config error: model.size: must be one of {', '.join(MODEL_SIZES)}, got {size!r}")
    for key, value in MODEL_SIZES[size].items():
        if key in model and model[key] != value:
            raise ConfigError(f"config error: model.{key}: {model[key]!r} is not {size}'s {value} (model.size: "
                              f"{size}); set model.size: null to size the student yourself")
    return {**model, **MODEL_SIZES[size]}


@dataclass
class FlowConfig:
    """Noising, time sampling, self-conditioning guidance, decode examples (arXiv 2609.29102 §3,
    Eq. 1, 7-9) and the prompt drop of ELF's recipe."""

    sigma: float = 2.0
    c_min: float = 0.05
    t_logit_mean: float = -1.5
    t_logit_std: float = 0.8
    sc_prob: float = 0.5
    w_min: float = 0.5  # SC-CFG scale range; 1+w is log-uniform on [1+w_min, 1+w_max]
    w_max: float = 5.0
    decode_prob: float = 0.2
    decode_lambda_mean: float = 0.8  # logit-normal per-token mixing λ of decode inputs
    decode_lambda_std: float = 0.8
    decode_noise_scale: float = 1.0  # s in λ·x + (1-λ)·s·ε
    # ELF's label drop: an example's prompt is dropped (zeros at its positions, and the frozen
    # models read the answer alone) with this probability; what prompt CFG (sample.prompt_cfg) uses
    prompt_drop: float = 0.0


@dataclass
class LossConfig:
    """The weights of the training signals: L = L_ELF + 0.5·L_REPA + 0.1·L_REG. Which signals
    there are is the student's shape (``model.repa``, ``model.extra_token``)."""

    repa_weight: float = 0.5
    reg_weight: float = 0.1


def needs_teacher(repa: bool, extra_token: str) -> bool:
    """The one rule for when the frozen teacher is needed: REPA is on or the REG token is used
    (ELF-REG §3, App. A). The student then has a teacher-width projector or REG head, and training loads
    the teacher; otherwise the teacher is never loaded."""
    return repa or extra_token == "reg"


ParallelMode = Literal["none", "ddp", "fsdp2"]
PARALLEL_MODES: tuple[str, ...] = typing.get_args(ParallelMode)


@dataclass
class TrainConfig:
    """Optimisation, checkpointing and logging."""

    steps: int = 1000  # used when epochs is 0
    epochs: float = 0.0  # > 0: steps = ceil(epochs * prepared samples / (batch_size * grad_accum))
    init_from: str | None = None  # checkpoint (or run folder) whose weights start a fresh run at step 0
    batch_size: int = 512  # the global batch (ELF's global_batch_size)
    grad_accum: int = 1
    lr: float = 2e-3  # ELF's blr 1e-3 scaled by the global batch: 1e-3 × 512 / 256
    min_lr_ratio: float = 0.1  # the cosine schedule's floor, a fraction of lr
    # the cosine schedule's length in steps, the floor held after it; None: the run's steps. Set to a
    # finished cosine run's steps, it trains that run further at its floor on the course it was on
    decay_steps: int | None = None
    warmup_steps: int = 5000
    schedule: Literal["cosine", "constant"] = "constant"
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    ema_decay: float = 0.9999
    seed: int = 0
    out_dir: str = "runs/elfreg"
    ckpt_every: int = 500
    # epochs (of the data, as train.epochs counts them) whose checkpoints are written whatever
    # ckpt_every says and kept through rotation, each linked as checkpoints/epoch-E
    keep_epochs: list[float] = field(default_factory=list)
    log_every: int = 10
    device: str = "auto"  # auto: cuda when available, else cpu
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 on CUDA, fp32 on every CPU (elfreg.device)
    feature_cache: bool = False  # keep frozen features of seen examples in memory (small data sets)
    host_memory: Literal["keep", "release"] = "keep"  # keep: malloc reuses freed memory (elfreg.host_memory)
    progress: bool = True
    # scale-out (docs/scaling.md); batch_size is the global micro-batch, split over the ranks
    parallel: ParallelMode = "none"
    activation_checkpointing: bool = False  # recompute each student block in the backward pass
    compile: bool = False  # torch.compile each student block
    optimizer: Literal["adamw", "muon"] = "muon"  # muon: ELF's Muon on every matrix, Nesterov-Adam on the rest
    muon_momentum: float = 0.95
    peak_tflops: float = 989.0  # per-device peak for MFU (H100/H200 dense bf16); 0 turns MFU off


Sampler = Literal["early-stop", "full-span", "renoise", "adaptive", "sde"]
SAMPLERS: tuple[str, ...] = typing.get_args(Sampler)
FullSpanGrid = Literal["logit-normal", "uniform"]
FULL_SPAN_GRIDS: tuple[str, ...] = typing.get_args(FullSpanGrid)
RenoiseMode = Literal["both", "schedule", "renoise"]
RENOISE_MODES: tuple[str, ...] = typing.get_args(RenoiseMode)
# Named sampler settings, applied under any explicit flag (``--sampling NAME``): ELF's sampling
# configs (its sampling_configs/*.yml; N steps are N + 1 NFE with the decode). elf-cond: its
# conditional one (Euler over 64 steps of a logit-normal grid, prompt CFG 2, SC-CFG 1);
# elf-uncond-32 / -64: its unconditional ones (the SDE step, γ 1.5 at 32 steps, 1.0 at 64,
# SC-CFG 3); elf-pd-few / elf-pd-many: its distilled student's (γ 1.5 and SC-CFG 2.5 at 1-8 steps,
# γ 2.0 and SC-CFG 2.0 at 16-32; no NFE: give --nfe).
_ELF_SDE = {"sampler": "sde", "full_span_grid": "logit-normal", "prompt_cfg": 1.0}
SAMPLING_PRESETS: dict[str, dict[str, Any]] = {
    "elf-cond": {"sampler": "full-span", "nfe": 65, "full_span_grid": "logit-normal", "sc_cfg": 1.0,
                 "prompt_cfg": 2.0},
    "elf-uncond-32": {**_ELF_SDE, "nfe": 33, "sde_gamma": 1.5, "sc_cfg": 3.0},
    "elf-uncond-64": {**_ELF_SDE, "nfe": 65, "sde_gamma": 1.0, "sc_cfg": 3.0},
    "elf-pd-few": {**_ELF_SDE, "sde_gamma": 1.5, "sc_cfg": 2.5},
    "elf-pd-many": {**_ELF_SDE, "sde_gamma": 2.0, "sc_cfg": 2.0},
}


def few_step_sampling(steps: int) -> dict[str, Any]:
    """How ELF samples its distilled student at ``steps`` steps: ``elf-pd-few`` up to 8 steps,
    ``elf-pd-many`` beyond (its uncond_fewstep_sampling_configs.yml), at steps + 1 NFE."""
    return {**SAMPLING_PRESETS["elf-pd-few" if steps <= 8 else "elf-pd-many"], "nfe": steps + 1}


@dataclass
class SampleConfig:
    """Sampler settings (ELF-REG §3, §5.1 and App. C; adaptive exit and trimming beyond the paper):
    the one place they are defined. ``elfreg sample`` and ``elfreg eval`` take each field as a flag
    of the same name (``--renoise-eta``), whose help is the field's ``help`` metadata."""

    sampler: Sampler = field(
        default="early-stop",
        metadata={"help": "sampler (ELF-REG §3 and App. C; sde: ELF's SDE step; adaptive exit: beyond the paper)"})
    nfe: int = field(default=64, metadata={
        "help": "NFE budget N: N − 1 denoiser calls + 1 decode (adaptive: at most N)"})
    rho: int = field(default=8, metadata={
        "help": "master-grid ratio ρ (M = ρ·N points) of early-stop, re-noising, adaptive"})
    full_span_grid: FullSpanGrid = field(default="logit-normal", metadata={
        "help": "full-span's time grid: logit-normal (ELF's: 0, N−2 sorted sigmoid(N(−1.5, 0.8)) draws of "
                "the sample's seed, 1) or uniform"})
    sc_cfg: float = field(default=3.0, metadata={
        "help": "SC-CFG scale w, a network input (GSM8K 3, code and MATH 2)"})
    prompt_cfg: float = field(default=1.0, metadata={
        "help": "plain prompt CFG scale; ≠ 1 adds a prompt-dropped call per step (inference-only)"})
    sde_gamma: float = field(default=1.0, metadata={
        "help": "SDE: γ of ELF's SDE step (each step but the last starts from t·clip(1 − γ·h, 0, 1) with fresh "
                "noise; ELF: 1.5 at 32 steps, 1.0 at 64; 0: full-span)"})
    renoise_mode: RenoiseMode = field(default="both", metadata={
        "help": "re-noising parts (Table 4/30): both; schedule (its time grid, plain Euler); renoise "
                "(fresh noise on the early-stop grid)"})
    renoise_eta: float = field(default=1.2, metadata={"help": "re-noising: noise scale η of the fresh noise"})
    renoise_power: float = field(default=0.5, metadata={"help": "re-noising: schedule power p"})
    adaptive_patience: int = field(default=2, metadata={
        "help": "adaptive exit: stop after this many checks whose answer equals the previous one"})
    adaptive_interval: int = field(default=4, metadata={"help": "adaptive exit: check every K denoiser steps"})
    reg: bool = field(default=True, metadata={
        "help": "run the REG token at inference (false: REG removed at inference, Table 5)"})
    trim: bool = field(default=False, metadata={
        "help": "canvas trimming (beyond the paper): once a sample's decoded answer end is stable, "
                "run it on the canvas up to that end + trim_margin only; checks add decoder calls"})
    trim_interval: int = field(default=4, metadata={"help": "canvas trimming: check every K denoiser steps"})
    trim_patience: int = field(default=2, metadata={
        "help": "canvas trimming: trim after this many checks whose answer end equals the previous one"})
    trim_margin: int = field(default=8, metadata={
        "help": "canvas trimming: answer positions kept past the stable end (the EOS region the model sees)"})

    def validate(self) -> SampleConfig:
        """Range checks (one-line :class:`ConfigError` naming the key); returns self."""
        checks = [
            ("sampler", self.sampler in SAMPLERS, f"must be one of {', '.join(SAMPLERS)}"),
            ("nfe", isinstance(self.nfe, int) and self.nfe >= 2, "must be an integer >= 2"),
            ("rho", isinstance(self.rho, int) and self.rho >= 1, "must be an integer >= 1"),
            ("sc_cfg", self.sc_cfg > 0, "must be > 0"),
            ("prompt_cfg", self.prompt_cfg >= 0, "must be >= 0"),
            ("renoise_eta", self.renoise_eta >= 0, "must be >= 0"),
            ("sde_gamma", self.sde_gamma >= 0, "must be >= 0"),
            ("renoise_power", self.renoise_power > 0, "must be > 0"),
            ("adaptive_patience", self.adaptive_patience >= 1, "must be >= 1"),
            ("adaptive_interval", self.adaptive_interval >= 1, "must be >= 1"),
            ("renoise_mode", self.renoise_mode in RENOISE_MODES, f"must be one of {', '.join(RENOISE_MODES)}"),
            ("full_span_grid", self.full_span_grid in FULL_SPAN_GRIDS, f"must be one of {', '.join(FULL_SPAN_GRIDS)}"),
            ("trim_interval", isinstance(self.trim_interval, int) and self.trim_interval >= 1,
             "must be an integer >= 1"),
            ("trim_patience", isinstance(self.trim_patience, int) and self.trim_patience >= 1,
             "must be an integer >= 1"),
            ("trim_margin", isinstance(self.trim_margin, int) and self.trim_margin >= 0,
             "must be an integer >= 0"),
            ("trim", not (self.trim and self.sampler == "adaptive"),
             "cannot be combined with the adaptive sampler (both stop on checks of the decoded answer)"),
        ]
        for key, ok, why in checks:
            if not ok:
                raise ConfigError(f"config error: sample.{key}: {why}, got {getattr(self, key)!r}")
        return self

    def replace(self, **changes: Any) -> SampleConfig:
        """A validated copy with ``changes``; ``None`` values are ignored (unset CLI flags)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"config error: sample: unknown key(s) {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None}).validate()


@dataclass
class EvalConfig:
    """Evaluation settings (ELF-REG §5, App. B): ``elfreg eval`` and the toy demo read them. Sweeps over
    NFE and samplers run every pair; empty lists mean the ``sample`` section's single value."""

    samples: int = field(default=16, metadata={"help": "generations per problem; sample j uses seed + j"})
    seed: int = field(default=0, metadata={"help": "seed of sample 0"})
    limit: int = field(default=0, metadata={"help": "only the first N problems (0: all)"})
    nfes: list[int] = field(default_factory=list, metadata={"help": "NFE sweep (empty: sample.nfe)"})
    samplers: list[str] = field(default_factory=list, metadata={"help": "sampler sweep (empty: sample.sampler)"})
    batch_size: int = field(default=8, metadata={"help": "samples per network batch when generating"})
    workers: int = field(default=0, metadata={"help": "parallel sandboxes for code tasks (0: CPU count)"})
    timeout: float = field(default=10.0, metadata={"help": "seconds per assert test suite (code tasks)"})
    plus_timeout: float = field(default=60.0, metadata={
        "help": "cap in seconds on one program's extended tests (HumanEval+/MBPP+)"})
    plus_limit: int = field(default=0, metadata={"help": "HumanEval+/MBPP+: only the first N plus inputs (0: all)"})
    alias: bool = field(default=True, metadata={
        "help": "headline code score with the entry-point alias (both are always reported)"})
    source: str = field(default="auto", metadata={
        "help": "auto (local copy, else the Hub), local, hub, or a JSONL file path"})
    data_dir: str | None = field(default=None, metadata={
        "help": "benchmark data directory (default $ELFREG_DATA_DIR, else the user cache data/ folder)"})
    template: str | None = field(default=None, metadata={"help": "prompt template (str.format fields of the task)"})
    ppl_model: str = field(default="gpt2-large", metadata={
        "help": "owt-genppl: the causal LM whose perplexity scores the texts (hub id or folder; ELF's gpt2-large)"})
    ppl_batch_size: int = field(default=16, metadata={"help": "owt-genppl: texts per forward of the scoring LM"})
    # toy demo only (elfreg eval does not take them)
    split: Literal["valid", "test"] = field(default="test", metadata={
        "cli": False, "help": "held-out split of the toy tasks (valid for tuning)"})
    curve_points: int = field(default=0, metadata={
        "cli": False, "help": "held-out evaluations at evenly spaced steps during training"})

    def validate(self) -> EvalConfig:
        checks = [
            ("samples", self.samples >= 1, "must be >= 1"),
            ("limit", self.limit >= 0, "must be >= 0 (0: all problems)"),
            ("nfes", all(n >= 2 for n in self.nfes), "every NFE must be >= 2"),
            ("samplers", all(s in SAMPLERS for s in self.samplers), f"each must be one of {', '.join(SAMPLERS)}"),
            ("curve_points", self.curve_points >= 0, "must be >= 0"),
            ("batch_size", self.batch_size >= 1, "must be >= 1"),
            ("workers", self.workers >= 0, "must be >= 0 (0: CPU count)"),
            ("timeout", self.timeout > 0, "must be > 0"),
            ("plus_timeout", self.plus_timeout > 0, "must be > 0"),
            ("plus_limit", self.plus_limit >= 0, "must be >= 0 (0: all)"),
            ("ppl_batch_size", self.ppl_batch_size >= 1, "must be >= 1"),
        ]
        for key, ok, why in checks:
            if not ok:
                raise ConfigError(f"config error: eval.{key}: {why}, got {getattr(self, key)!r}")
        return self

    def points(self, sampler: str | None = None, nfe: int | None = None) -> list[dict[str, Any]]:
        """Every (sampler, NFE) pair of the sweep (sampler-major) as changes to the sampler
        settings; an axis the sweep leaves empty keeps ``sampler`` / ``nfe`` (left out when None:
        the checkpoint's own setting then holds)."""
        return [{k: v for k, v in (("sampler", s), ("nfe", n)) if v is not None}
                for s in self.samplers or [sampler] for n in self.nfes or [nfe]]

    def grid(self, sample: SampleConfig) -> list[SampleConfig]:
        """:meth:`points` as whole sampler settings, starting from ``sample``."""
        return [sample.replace(**point) for point in self.points(sample.sampler, sample.nfe)]


@dataclass
class Config:
    text: TextConfig = field(default_factory=TextConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    @property
    def needs_teacher(self) -> bool:
        """Whether training needs the frozen teacher (:func:`needs_teacher`)."""
        return self.model.needs_teacher

    def validate(self) -> Config:
        """Range checks that types alone cannot express; returns self."""
        checks = [
            ("text.encoder_layer", self.text.encoder_layer >= 1 or self.text.encoder_layer == -1,
             "must be >= 1, or -1 for the model's output"),
            ("text.standardize", self.text.standardize in ("token", "global"), "must be token or global"),
            ("text.latent_std", self.text.latent_std > 0, "must be > 0"),
            ("text.repa_shift", self.text.repa_shift in (0, 1), "must be 0 or 1"),
            ("text.canvas_len", self.text.canvas_len >= 2, "must be >= 2"),
            ("text.prompt_cap", 1 <= self.text.prompt_cap < self.text.canvas_len,
             "must be in [1, canvas_len)"),
            ("text.prompt_truncation", self.text.prompt_truncation in ("left", "right"), "must be left or right"),
            ("text.answer_cap", self.text.answer_cap >= 0, "must be >= 0 (0: the whole answer region)"),
            ("model.width", self.model.width % self.model.heads == 0, "must be divisible by heads"),
            ("model.width", (self.model.width // self.model.heads) % 2 == 0,
             "width/heads must be even (RoPE)"),
            ("model.size", self.model.size is None or (
                self.model.size in MODEL_SIZES
                and all(getattr(self.model, k) == v for k, v in MODEL_SIZES[self.model.size].items())),
             f"must be one of {', '.join(MODEL_SIZES)} with its sizes, or null"),
            ("model.repa_block", 1 <= self.model.repa_block <= self.model.depth,
             "must be in [1, depth]"),
            ("model.bottleneck", self.model.bottleneck >= 1, "must be >= 1"),
            ("model.vocab_size", self.model.vocab_size >= 0, "must be >= 0 (0: the encoder's vocabulary)"),
            ("model.time_tokens", self.model.time_tokens >= 1, "must be >= 1"),
            ("model.cfg_tokens", self.model.cfg_tokens >= 0, "must be >= 0"),
            ("model.mode_tokens", self.model.mode_tokens >= 0, "must be >= 0"),
            ("model.time_freq_dim", self.model.time_freq_dim >= 2, "must be >= 2"),
            ("model.dropout", 0 <= self.model.dropout < 1, "must be in [0, 1)"),
            ("flow.sigma", self.flow.sigma > 0, "must be > 0"),
            ("flow.c_min", 0 < self.flow.c_min < 1, "must be in (0, 1)"),
            ("flow.sc_prob", 0 <= self.flow.sc_prob <= 1, "must be in [0, 1]"),
            ("flow.sc_prob", self.flow.sc_prob > 0 or self.model.cfg_tokens == 0,
             "0 (no self-conditioning) needs model.cfg_tokens: 0: SC-CFG tokens carry the guidance scale of "
             "self-conditioning, and ELF's sampler would feed such a model's untrained self_cond_proj"),
            ("flow.decode_prob", 0 <= self.flow.decode_prob <= 1, "must be in [0, 1]"),
            ("flow.prompt_drop", 0 <= self.flow.prompt_drop < 1, "must be in [0, 1)"),
            ("flow.w_min", 0 < self.flow.w_min <= self.flow.w_max, "must be in (0, w_max]"),
            ("train.steps", self.train.steps >= 1, "must be >= 1"),
            ("train.batch_size", self.train.batch_size >= 1, "must be >= 1"),
            ("train.grad_accum", self.train.grad_accum >= 1, "must be >= 1"),
            ("train.lr", self.train.lr > 0, "must be > 0"),
            ("train.ema_decay", 0 <= self.train.ema_decay < 1, "must be in [0, 1)"),
            ("train.warmup_steps", self.train.warmup_steps >= 0, "must be >= 0"),
            ("train.min_lr_ratio", 0 <= self.train.min_lr_ratio <= 1, "must be in [0, 1]"),
            ("train.decay_steps", self.train.decay_steps is None or self.train.decay_steps >= 1,
             "must be >= 1 (or unset: train.steps)"),
            ("train.weight_decay", self.train.weight_decay >= 0, "must be >= 0"),
            ("train.grad_clip", self.train.grad_clip > 0, "must be > 0"),
            ("train.ckpt_every", self.train.ckpt_every >= 1, "must be >= 1"),
            ("train.keep_epochs", all(e > 0 for e in self.train.keep_epochs), "every epoch must be > 0"),
            ("train.device", check_device_name(self.train.device) is None, check_device_name(self.train.device) or ""),
            ("train.log_every", self.train.log_every >= 1, "must be >= 1"),
            ("train.out_dir", bool(self.train.out_dir.strip()), "must not be empty"),
            ("train.parallel", self.train.parallel in PARALLEL_MODES, f"must be one of {', '.join(PARALLEL_MODES)}"),
            ("train.optimizer", not (self.train.optimizer == "muon" and self.train.parallel == "fsdp2"),
             "muon is not supported with train.parallel=fsdp2 (Muon orthogonalises whole matrices, FSDP2 "
             "holds shards); use ddp or adamw"),
            ("train.optimizer", self.train.optimizer in ("adamw", "muon"), "must be adamw or muon"),
            ("text.shard_frozen", not self.text.shard_frozen or self.train.parallel == "fsdp2",
             "needs train.parallel=fsdp2"),
            ("text.shard_frozen", not (self.text.shard_frozen and self.train.feature_cache),
             "cannot be used with train.feature_cache (sharded frozen models run on every rank at once; "
             "the cache skips them on some ranks only)"),
            ("train.peak_tflops", self.train.peak_tflops >= 0, "must be >= 0 (0: no MFU)"),
            ("loss.repa_weight", self.loss.repa_weight >= 0, "must be >= 0"),
            ("loss.reg_weight", self.loss.reg_weight >= 0, "must be >= 0"),
            ("train.epochs", self.train.epochs >= 0, "must be >= 0 (0: train.steps decides)"),
            ("train.init_from", self.train.init_from is None or bool(self.train.init_from.strip()),
             "must not be empty"),
            *self.data.checks(),
            *self.distill.checks(),
        ]
        if self.needs_teacher:
            checks.append(("text.teacher", bool(self.text.teacher),
                           "REPA/REG need a teacher (set model.repa: false and model.extra_token: none)"))
        for key, ok, why in checks:
            if not ok:
                raise ConfigError(f"config error: {key}: {why}")
        self.sample.validate()
        self.eval.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Config:
        """A validated config from a mapping: keys of earlier versions at their current place
        (:func:`~elfreg.config.migration.migrate`), a named ``model.size`` filled in."""
        data = migrate(data or {})
        if isinstance(data.get("model"), dict):
            data["model"] = sized(data["model"])
        return build_dataclass(cls, data, prefix="").validate()

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> Config:
        """Load a YAML file, then apply ``key.sub=value`` overrides (values parsed as YAML)."""
        data = read_yaml_mapping(path)
        apply_config_overrides(data, overrides)
        return cls.from_dict(data)


def apply_config_overrides(data: dict[str, Any], overrides: list[str] | None) -> None:
    """``section.key=value`` overrides applied in place to a run config's mapping; a key of an
    earlier version (``loss.repa``) sets its current place, as the mapping's own keys are moved
    there first (:mod:`elfreg.config.migration`)."""
    data.update(migrate(data))
    for item in overrides or []:
        key, sep, value = item.partition("=")
        apply_override(data, f"{migrated_key(key.strip())}{sep}{value}")
