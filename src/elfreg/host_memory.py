"""Host memory on a CPU: keep freed memory for the next training step or network call instead of
returning it.

A training step allocates and frees the same large tensors every step (activations, weight casts
under autocast, gradients). glibc's malloc serves a request above its *mmap threshold* with fresh
pages from the kernel and unmaps them when the tensor is freed, and trims the top of its heap back
to the kernel once more than its *trim threshold* is free; every step then page-faults the same
memory in again, and the kernel zeroes each page first. On a 2-core CPU this was 100,000 page
faults and 0.4 s of system time per ELF-REG-B training step in bf16 (docs/performance.md).

:func:`keep_freed_memory` sets the mmap threshold to its largest value (32 MiB) and the trim
threshold to 2 GiB, so such tensors come from the heap and freed memory stays there for reuse.
The process keeps its peak memory instead of handing it back between steps, which is what a
training process does anyway (CUDA's caching allocator behaves the same way). It changes which
addresses tensors get, never a value: losses and weights are the same bit for bit.

``train.host_memory: keep`` (the default) applies it when a training run starts;
``release`` leaves malloc as it is. Network calls repeat the same pattern: a B-shape denoise call
at batch 16 page-faulted 174,000 times with malloc's default and ran 1.08x slower
(docs/performance.md), so ``elfreg sample`` and ``elfreg eval`` apply it too (``--host-memory
keep``, the default). Other C libraries than glibc are left alone.
"""

from __future__ import annotations

import argparse
import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's upper limit for the mmap threshold on 64-bit systems
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl and others lack it)
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Make this process's malloc keep freed memory for reuse (see the module docstring).
    Returns whether it was applied (False where the C library is not glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def add_host_memory_flag(parser: argparse.ArgumentParser) -> None:
    """``--host-memory keep|release`` for a command whose process samples on a CPU."""
    parser.add_argument("--host-memory", choices=("keep", "release"), default="keep",
                        help="keep (default): malloc keeps freed memory for the next network call; "
                             "release: malloc's own behaviour (elfreg.host_memory)")


def apply_host_memory(setting: str) -> bool:
    """Apply ``--host-memory``/``train.host_memory``: :func:`keep_freed_memory` for ``keep``, nothing
    for ``release``. Returns whether malloc was changed."""
    if setting not in ("keep", "release"):
        raise ValueError(f"host memory setting must be 'keep' or 'release', not {setting!r}")
    return keep_freed_memory() if setting == "keep" else False
