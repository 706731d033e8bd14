"""How many samples a sampling call runs through the student's blocks at a time on a CPU.

A network call's body (the blocks) works sample by sample: attention mixes positions of one
sample only, every other op is row-wise. Running a large batch through the blocks in chunks of
samples therefore computes the same thing; what changes is how much of the call's intermediates
stay in the CPU's last-level cache. The prefix tokens, the embeddings and the heads still run on
the whole batch, so every matmul of a chunk has at least one sample's positions as rows.

The rule looks at the MLP's widest intermediate, the gate and up projections of every position
(positions × 2·hidden values in the compute dtype). A batch whose intermediate is more than
:data:`SPLIT_ABOVE` times the last-level cache runs in chunks whose intermediate fills at most
:data:`CACHE_SHARE` of it, with at least :data:`MIN_ROWS` rows (smaller matmuls lose more than
the cache gives). Measured at the ELF-REG-B shape on a 2-core AMD EPYC with a 32 MiB L3 by
``benchmarks/cache_chunks_ab.py``, each case against the whole batch in the same interleaved
rounds (docs/performance.md): bf16 batch 32 (68 MiB) 1.33× faster in the rule's chunks of 6–7
samples, batch 8 and 16 (17 and 34 MiB) no faster in chunks of 4 or 8 (0.97–1.00×); fp32 batch 16
(68 MiB) 1.08× in the rule's chunks of 2–3 (1.20× in chunks of 4), batch 32 1.33×, batch 8 0.96×
in chunks of 4. On a GPU, or where the cache size is unknown, nothing is chunked.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import torch

# A batch is chunked when its MLP intermediate exceeds this many last-level caches: at about one
# cache (B shape, bf16, batch 16) the chunks measured no faster than the whole batch.
SPLIT_ABOVE = 1.5
# Fraction of the last-level cache a chunk's MLP intermediate may fill: the rest holds the
# residual stream, the norms' fp32 values and the weights streaming through.
CACHE_SHARE = 0.5
# Fewest rows a chunk's matmuls get: in a 3-round sweep on the machine above (not kept), one
# B-shape sample (260 rows) per chunk ran an fp32 call at batch 8 0.82× as fast as the whole batch.
MIN_ROWS = 512
_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def _size_bytes(text: str) -> int | None:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else None


def last_level_cache_bytes(cache_dir: Path = _CACHE_DIR) -> int | None:
    """The largest data or unified cache this CPU reports (``/sys/.../cpu0/cache``), or None."""
    sizes = []
    for index in sorted(cache_dir.glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = _size_bytes((index / "size").read_text())
        except OSError:
            continue
        if size:
            sizes.append(size)
    return max(sizes, default=None)


def chunk_sizes(batch: int, positions: int, mlp_hidden: int, element_bytes: int,
                cache_bytes: int | None) -> list[int] | None:
    """Samples in each chunk for a call of ``batch`` samples of ``positions`` rows each (prefix
    tokens included), or None when the whole batch fits the rule (or ``cache_bytes`` is None).

    The chunks are as even as the batch allows (a batch of 16 with room for 3 runs as
    3, 3, 3, 3, 2, 2, not 3 × 5 + 1), so no chunk is a sliver.
    """
    if cache_bytes is None or batch < 2:
        return None
    per_sample = positions * 2 * mlp_hidden * element_bytes
    if batch * per_sample <= SPLIT_ABOVE * cache_bytes:
        return None
    fits = max(math.ceil(MIN_ROWS / positions), int(CACHE_SHARE * cache_bytes // per_sample))
    return None if fits >= batch else even_chunks(batch, fits)


def even_chunks(batch: int, most: int) -> list[int]:
    """``batch`` samples in the fewest chunks of at most ``most``, their sizes within one."""
    count = math.ceil(batch / most)
    size, larger = divmod(batch, count)
    return [size + 1] * larger + [size] * (count - larger)


def cpu_cache_bytes(device: torch.device) -> int | None:
    """The last-level cache the rule sizes chunks by: None off a CPU. ``ELFREG_CPU_CACHE_BYTES``
    overrides what the CPU reports (0 turns chunking off)."""
    if device.type != "cpu":
        return None
    override = os.environ.get("ELFREG_CPU_CACHE_BYTES")
    if override is not None:
        if not override.isdigit():
            raise ValueError(f"ELFREG_CPU_CACHE_BYTES must be a whole number of bytes, got {override!r}")
        return int(override) or None
    return _this_cpu_cache_bytes()


@functools.cache
def _this_cpu_cache_bytes() -> int | None:
    # read once per process: the sysfs reads cost about 0.2 ms, 2-3 % of a small model's call
    return last_level_cache_bytes()
