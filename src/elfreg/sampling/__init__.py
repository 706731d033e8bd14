"""Sampling (spec §4, §8): time grids, Eq. 12 updates, early-stop / full-span / re-noising /
adaptive-exit samplers, NFE counting, trajectories and the generation API.

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
    "SamplingOptions": "options",
    "SAMPLERS": "options",
    "Network": "network",
    "StudentNetwork": "network",
    "CountingNetwork": "counting",
    "SamplerOutput": "context",
    "run_sampler": "samplers",
    "Trajectory": "trajectory",
    "GenerationResult": "generation",
    "generate": "generation",
    "generate_with_options": "generation",
    "generate_from_checkpoint": "api",
    "generate_results_from_checkpoint": "api",
    "load_for_sampling": "api",
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
