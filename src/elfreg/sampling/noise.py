"""Per-sample noise: every sample draws from its own generator, so results do not depend on the
batch a sample is run in (spec §4: sample j of a prompt uses seed ``seed + j``).

Draw order of one sample (part of the reproducibility contract): the initial text noise for the
whole canvas (L, d) — only answer positions are used — then the initial REG noise (d_r), then,
for the re-noising sampler only, one (L, d) text draw and one (d_r) REG draw per re-noised step.
The generators live on the network's device; the same seed gives the same noise on the same
device type.
"""

from __future__ import annotations

import torch


class NoiseSource:
    """Standard normal draws from one generator per sample."""

    def __init__(self, seeds: list[int], device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.generators = [torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds]

    def normal(self, rows: torch.Tensor | list[int], shape: tuple[int, ...]) -> torch.Tensor:
        """(len(rows), *shape) draws; row k comes from the generator of sample ``rows[k]``."""
        rows = rows.tolist() if isinstance(rows, torch.Tensor) else rows
        return torch.stack([torch.randn(shape, generator=self.generators[r], device=self.device) for r in rows])
