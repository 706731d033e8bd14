"""GEMM ceilings: GFLOP/s of square matmuls per precision, the yardstick of every other number."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .common import interleaved


def gemm_ceilings(sizes: list[int], precisions: list[str], repeats: int, device: torch.device) -> dict:
    """For each n in ``sizes`` and each precision, the median GFLOP/s of ``a @ b`` with
    a, b of shape (n, n) (2·n³ FLOPs a call), all cases timed interleaved. ``ceiling`` per
    precision is the best size's number: the one the other sections divide by."""
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    cases, flops = {}, {}
    for prec in precisions:
        for n in sizes:
            gen = torch.Generator().manual_seed(n)
            a = torch.randn(n, n, generator=gen).to(device, dtypes[prec])
            b = torch.randn(n, n, generator=gen).to(device, dtypes[prec])
            name = f"{prec}_{n}"
            cases[name] = (lambda a=a, b=b: torch.mm(a, b))
            flops[name] = 2.0 * n ** 3
    seconds = interleaved(cases, repeats, device)
    rows = {name: {"seconds": s, "gflops": flops[name] / s / 1e9} for name, s in seconds.items()}
    ceiling = {prec: max(rows[f"{prec}_{n}"]["gflops"] for n in sizes) for prec in precisions}
    return {"sizes": sizes, "repeats": repeats, "cases": rows, "ceiling_gflops": ceiling}


class GemmProbe:
    """An n×n×n matmul at one precision, timed in the same interleaved rounds as the cases it is
    the yardstick of, so that *their* fraction of the ceiling is measured under the same load
    (a machine shared with other jobs can be much slower in one minute than in the next)."""

    def __init__(self, n: int, precision: str, device: torch.device):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
        gen = torch.Generator().manual_seed(n)
        self.a = torch.randn(n, n, generator=gen).to(device, dtype)
        self.b = torch.randn(n, n, generator=gen).to(device, dtype)
        self.flops = 2.0 * n ** 3

    def __call__(self) -> torch.Tensor:
        return torch.mm(self.a, self.b)

    def gflops(self, seconds: float) -> float:
        return self.flops / seconds / 1e9


def timed_beside_probe(cases: dict[str, Callable[[], Any]], precision: str, repeats: int,
                       device: torch.device, probe_n: int = 2048) -> tuple[dict[str, float], float]:
    """Median seconds of each case (:func:`perf.common.interleaved`) and the GFLOP/s of a
    :class:`GemmProbe` timed in the same rounds, the yardstick of the cases' FLOP floors."""
    probe = GemmProbe(probe_n, precision, device)
    seconds = interleaved({"gemm_probe": probe, **cases}, repeats, device)
    return seconds, probe.gflops(seconds.pop("gemm_probe"))
