"""Device and precision choice shared by training and sampling.

bf16 autocast speeds matrix work up only where the hardware has bf16 arithmetic: on CUDA, and on
CPUs whose oneDNN reports bf16 support (AVX-512-BF16 or AMX). On other CPUs (AVX2 only) bf16 is
emulated and several times slower than fp32, so ``precision: auto`` picks fp32 there.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cpu_has_fast_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def use_bf16(device: torch.device, precision: str) -> bool:
    """Whether to run under bf16 autocast for ``precision`` in {auto, bf16, fp32}."""
    if precision == "bf16":
        return True
    if precision == "fp32":
        return False
    return device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16())


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on ``device`` when enabled; losses and reductions stay fp32 in elfreg code."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()
