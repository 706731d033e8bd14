"""Sampling (ELF-REG §3, §5.1 and App. C; adaptive exit beyond the paper): time grids, the Eq. 12
update loop shared by every sampler (early-stop, full-span, re-noising, adaptive exit), NFE
counting, trajectories, and :func:`generate`, the one way from prompts to answers.

Public names are imported lazily so that ``elfreg --help`` does not load the model stack.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "master_grid": "grids",
    "full_span_grid": "grids",
    "power_schedule": "grids",
    "grid_generator": "grids",
    "nominal_snr": "grids",
    "Network": "network",
    "StudentNetwork": "network",
    "CountingNetwork": "network",
    "SAMPLER_SPECS": "samplers",
    "SamplerOutput": "samplers",
    "run_sampler": "samplers",
    "Trajectory": "trajectory",
    "GenerationResult": "generation",
    "SamplingModels": "generation",
    "generate": "generation",
    "load_checkpoint": "generation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
