"""GEMM ceilings: GFLOP/s of square matmuls per precision, the yardstick of every other number."""

from __future__ import annotations

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
