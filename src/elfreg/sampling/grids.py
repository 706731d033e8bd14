"""Time grids of the three samplers (ELF-REG §3, App. C).

Time runs from 0 (noise) to 1 (clean). A grid of ``K`` points drives ``K − 1`` updates; the
network is evaluated at every point except the last.

- Full-span: ``N`` points from 0 to 1 → N − 1 updates ending at t = 1: by default ELF's grid, the
  master grid below at ρ = 1 (0, 1 and N − 2 sorted logit-normal points); or ``N`` uniform
  points 0, 1/(N−1), …, 1 (:func:`full_span_grid`).
- Prefix early-stop: the master grid of ``M = ρ·N`` points (0, 1 and ``M − 2`` sorted
  logit-normal(−1.5, 0.8) interior points); only its first ``N`` points are used, so the last
  prediction is made at ``t_{N−2}``.
- Re-noising (§5.1): ``t_i = t★·(i/(N−2))^p`` for i = 0..N−2, with ``t★`` the last prediction time
  of early-stop for the same N, ρ and grid draw.

Grids are drawn on the CPU in float64 from a ``torch.Generator``; :func:`grid_generator` derives a
sample's grid generator from its seed so that its grid draw never shares a random stream with its
noise draws.
"""

from __future__ import annotations

import torch

MASTER_LOGIT_MEAN = -1.5
MASTER_LOGIT_STD = 0.8

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One round of the SplitMix64 mixing function (decorrelates nearby integer seeds)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def grid_seed(seed: int) -> int:
    """The seed of a sample's master-grid generator, derived from the sample seed.

    A separate stream keeps the initial noise of a seed identical across samplers (early-stop,
    full-span, re-noising and adaptive start from the same ``y_0``), which pairs their outputs.
    """
    return _splitmix64(seed & _MASK64) >> 1  # manual_seed takes values below 2**63 here


def grid_generator(seed: int) -> torch.Generator:
    """A CPU generator for the master grid of the sample with seed ``seed``."""
    return torch.Generator().manual_seed(grid_seed(seed))


def full_span_grid(nfe: int) -> torch.Tensor:
    """Uniform grid of ``nfe`` points on [0, 1]: N − 1 updates, final time exactly 1 (float64)."""
    if nfe < 2:
        raise ValueError(f"full-span needs nfe >= 2 (N − 1 updates + 1 decode); got {nfe}")
    return torch.linspace(0.0, 1.0, nfe, dtype=torch.float64)


def master_grid(nfe: int, rho: int, generator: torch.Generator, mean: float = MASTER_LOGIT_MEAN,
                std: float = MASTER_LOGIT_STD) -> torch.Tensor:
    """The prefix early-stop master grid (ELF-REG §3, App. C): ``M = rho·nfe`` sorted points in [0, 1].

    Point 0 is 0, point M−1 is 1 and the ``M − 2`` interior points are sigmoid(N(mean, std))
    draws from ``generator``, sorted. Returns a float64 CPU tensor of length M.
    """
    if nfe < 2:
        raise ValueError(f"early-stop needs nfe >= 2; got {nfe}")
    if rho < 1:
        raise ValueError(f"rho must be >= 1; got {rho}")
    m = rho * nfe
    normal = torch.randn(m - 2, generator=generator, dtype=torch.float64, device=generator.device).cpu()
    interior = torch.sigmoid(mean + std * normal).sort().values
    return torch.cat([torch.zeros(1, dtype=torch.float64), interior, torch.ones(1, dtype=torch.float64)])


def early_stop_prefix(master: torch.Tensor, nfe: int) -> torch.Tensor:
    """The first ``nfe`` points of a master grid: N − 1 updates, predictions at indices 0..N−2."""
    if master.numel() < nfe:
        raise ValueError(f"the master grid has {master.numel()} points, fewer than nfe={nfe}")
    return master[:nfe]


def last_prediction_time(master: torch.Tensor, nfe: int) -> float:
    """t★ = t_{N−2}: the time of early-stop's last clean prediction (the one that is decoded)."""
    return float(early_stop_prefix(master, nfe)[nfe - 2])


def power_schedule(nfe: int, t_star: float, power: float) -> torch.Tensor:
    """Re-noising evaluation times ``t_i = t★·(i/(N−2))^p``, i = 0..N−2 (N − 1 points, float64).

    With N = 2 the single evaluation is at t = 0 (there is no later time to reach).
    """
    if nfe < 2:
        raise ValueError(f"re-noising needs nfe >= 2; got {nfe}")
    if power <= 0:
        raise ValueError(f"the power p must be > 0; got {power}")
    if nfe == 2:
        return torch.zeros(1, dtype=torch.float64)
    frac = torch.arange(nfe - 1, dtype=torch.float64) / (nfe - 2)
    return t_star * frac.pow(power)


def nominal_snr(t: torch.Tensor | float, sigma: float) -> torch.Tensor:
    """Nominal signal-to-noise ratio of the training path at time t: t² / (σ²·(1 − t)²)."""
    t = torch.as_tensor(t, dtype=torch.float64)
    return t.pow(2) / (sigma ** 2 * (1 - t).pow(2))
