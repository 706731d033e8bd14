"""NFE accounting by counting the network calls actually made (spec §4).

Definition used throughout elfreg: one forward pass of the network over a batch counts **one
call for every row of that batch, charged to the sample the row belongs to**. A denoiser step on
a batch of 8 samples therefore adds 1 to each of the 8 samples; with prompt CFG the conditional
and the prompt-dropped rows of a sample are two rows, so a step adds 2 to that sample. A sample's
NFE is its denoiser calls plus its decoder calls. The frozen prompt encoder is not a network
call of the student and is never counted; decoding done only to record a trajectory goes to the
unwrapped network and is not counted either.
"""

from __future__ import annotations

import torch

from .network import Network


class CountingNetwork:
    """Wraps a :class:`Network` and charges every row of every call to its sample.

    Each call takes ``rows``: the sample index (0..n−1) of each row of the batch passed in
    (a sample may appear more than once). ``rows=None`` means rows 0..B−1.
    """

    def __init__(self, net: Network, n_samples: int):
        self.net = net
        self.reg_dim = net.reg_dim
        self.denoiser_calls = torch.zeros(n_samples, dtype=torch.long)
        self.decoder_calls = torch.zeros(n_samples, dtype=torch.long)

    @property
    def nfe(self) -> torch.Tensor:
        """(n,) network calls made for each sample so far."""
        return self.denoiser_calls + self.decoder_calls

    def _charge(self, counter: torch.Tensor, rows: torch.Tensor | None, batch: int) -> None:
        if rows is None:
            if batch > counter.numel():
                raise ValueError(f"a batch of {batch} rows needs explicit sample indices")
            rows = torch.arange(batch)
        rows = rows.detach().cpu().long()
        if rows.numel() != batch:
            raise ValueError(f"{rows.numel()} sample indices for a batch of {batch} rows")
        counter.index_add_(0, rows, torch.ones_like(rows))

    def denoise(self, z: torch.Tensor, q: torch.Tensor, t: torch.Tensor, w: torch.Tensor,
                prompt_mask: torch.Tensor, reg: torch.Tensor | None, reg_q: torch.Tensor | None,
                rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._charge(self.denoiser_calls, rows, z.shape[0])
        return self.net.denoise(z, q, t, w, prompt_mask, reg, reg_q)

    def decode(self, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None, w: torch.Tensor,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        self._charge(self.decoder_calls, rows, x.shape[0])
        return self.net.decode(x, prompt_mask, reg, w)
