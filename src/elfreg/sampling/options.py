"""Sampler settings (spec §4, §8), with defaults from a run's config."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..config import Config, FlowConfig, SampleConfig

SAMPLERS = ("early-stop", "full-span", "renoise", "adaptive")


@dataclass(frozen=True)
class SamplingOptions:
    """Everything that decides a sample besides the network, the prompt and the seed.

    - ``nfe``: the budget N (early-stop, full-span, re-noising use exactly N; adaptive at most N).
    - ``rho``: master-grid ratio ρ (M = ρ·N points) of early-stop, re-noising (for t★) and adaptive.
    - ``sc_cfg``: SC-CFG scale w, a network input (one call per step).
    - ``prompt_cfg``: plain prompt CFG scale; ≠ 1 adds a prompt-dropped call per step (two calls).
    - ``renoise_eta``, ``renoise_power``: η and p of the re-noising sampler (§5.1).
    - ``adaptive_patience``: stop after this many consecutive checks whose answer equals the
      previous check's; ``adaptive_interval``: a check every K denoiser steps (§8).
    - ``sigma``, ``c_min``: σ of the noise and the clamp of c_t, from the checkpoint's flow config.
    """

    # the defaults are those of the config, written once there
    sampler: str = SampleConfig.sampler
    nfe: int = SampleConfig.nfe
    rho: int = SampleConfig.rho
    sc_cfg: float = SampleConfig.sc_cfg
    prompt_cfg: float = SampleConfig.prompt_cfg
    renoise_eta: float = SampleConfig.renoise_eta
    renoise_power: float = SampleConfig.renoise_power
    adaptive_patience: int = SampleConfig.adaptive_patience
    adaptive_interval: int = SampleConfig.adaptive_interval
    sigma: float = FlowConfig.sigma
    c_min: float = FlowConfig.c_min

    def __post_init__(self) -> None:
        checks = [
            ("sampler", self.sampler in SAMPLERS, f"must be one of {', '.join(SAMPLERS)}"),
            ("nfe", isinstance(self.nfe, int) and self.nfe >= 2, "must be an integer >= 2"),
            ("rho", isinstance(self.rho, int) and self.rho >= 1, "must be an integer >= 1"),
            ("sc_cfg", self.sc_cfg > 0, "must be > 0"),
            ("prompt_cfg", self.prompt_cfg >= 0, "must be >= 0"),
            ("renoise_eta", self.renoise_eta >= 0, "must be >= 0"),
            ("renoise_power", self.renoise_power > 0, "must be > 0"),
            ("adaptive_patience", self.adaptive_patience >= 1, "must be >= 1"),
            ("adaptive_interval", self.adaptive_interval >= 1, "must be >= 1"),
            ("sigma", self.sigma > 0, "must be > 0"),
            ("c_min", 0 < self.c_min < 1, "must be in (0, 1)"),
        ]
        for key, ok, why in checks:
            if not ok:
                raise ValueError(f"sampling option {key}={getattr(self, key)!r}: {why}")

    @property
    def calls_per_step(self) -> int:
        """Network calls one denoiser step costs a sample (2 with prompt CFG)."""
        return 1 if self.prompt_cfg == 1.0 else 2

    def replace(self, **changes: Any) -> SamplingOptions:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, cfg: Config, **overrides: Any) -> SamplingOptions:
        """Defaults from ``cfg.sample`` and ``cfg.flow``; ``None`` overrides are ignored."""
        base = {**dataclasses.asdict(cfg.sample), "sigma": cfg.flow.sigma, "c_min": cfg.flow.c_min}
        unknown = set(overrides) - set(base)
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)
