"""Device and precision choice: the one rule every part of elfreg follows.

``precision`` is ``auto``, ``bf16`` or ``fp32``. ``auto`` resolves by the *kind* of device, never
by the model of CPU, so a result does not change with the machine it runs on:

- **CPU: fp32.** CPUs differ: some have native bf16 arithmetic (AVX-512-BF16, AMX), some only
  AVX2, where bf16 is emulated and several times slower. Letting ``auto`` follow the CPU made the
  same command train a different model on each kind (the toy demo lost 16 points of accuracy on a
  bf16 CPU, its tiny frozen LMs most of all). On a bf16 CPU fp32 costs little at toy sizes: a toy
  LM pretraining step was faster in fp32 (33 ms vs 38 ms), a demo student step 1.26× slower
  (262 ms vs 207 ms; ``docs/training.md``). Ask for ``bf16`` explicitly to trade that.
- **CUDA: bf16** autocast (the paper's setting); losses and reductions stay fp32.

``ELFREG_PRECISION=bf16|fp32`` in the environment changes what ``auto`` resolves to on every
device: the test suite runs once each way with it, and a user can try the other precision of a
whole pipeline without editing configs. An explicit ``bf16`` / ``fp32`` in a config always wins.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Literal

import torch

PRECISIONS = ("auto", "bf16", "fp32")
PRECISION_ENV = "ELFREG_PRECISION"

Resolved = Literal["bf16", "fp32"]


DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def check_device_name(name: str) -> str | None:
    """Why ``name`` is not a device elfreg can be told to use (``auto``, ``cpu``, ``cuda``,
    ``cuda:N``, ``mps``, ``xpu``…), or None when it is one. Whether it is present is checked later."""
    if name == "auto":
        return None
    try:
        kind = torch.device(name).type
    except (RuntimeError, ValueError):
        kind = None
    if kind not in DEVICE_TYPES:
        return f"must be auto or one of {', '.join(DEVICE_TYPES)} (e.g. cuda:1), got {name!r}"
    return None


def add_device_flags(parser) -> None:
    """``--device`` and ``--precision`` for a command that runs the student."""
    parser.add_argument("--device", default="auto",
                        help="auto (default: CUDA when available, else CPU), cpu, cuda or cuda:N")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto (default: bf16 on CUDA, fp32 on every CPU), bf16 or fp32")


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when available, else CPU. A CUDA device without CUDA fails with one line."""
    problem = check_device_name(name)
    if problem:
        raise ValueError(f"device {problem}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but this machine has no usable CUDA GPU")
    return device


def resolve_precision(device: torch.device | str, precision: str = "auto") -> Resolved:
    """The precision ``precision`` means on ``device`` (see the module docstring)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision  # type: ignore[return-value]
    forced = os.environ.get(PRECISION_ENV, "").strip()
    if forced:
        if forced not in ("bf16", "fp32"):
            raise ValueError(f"{PRECISION_ENV} must be bf16 or fp32, got {forced!r}")
        return forced  # type: ignore[return-value]
    return "bf16" if torch.device(device).type == "cuda" else "fp32"


def use_bf16(device: torch.device | str, precision: str = "auto") -> bool:
    """Whether to run under bf16 autocast for ``precision`` in {auto, bf16, fp32}."""
    return resolve_precision(device, precision) == "bf16"


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN reports native bf16 on this CPU (informational: reports and benchmarks
    print it; no default depends on it)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on ``device`` when enabled; losses and reductions stay fp32 in elfreg code."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()
