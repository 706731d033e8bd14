"""Stub networks with analytically known predictions, for sampler tests."""

from __future__ import annotations

import torch


class FixedNetwork:
    """Predicts a fixed clean state x̂ (answer positions) and a fixed r̂ whatever the input.

    ``prompt_gain`` > 0 adds ``prompt_gain × mean prompt state`` to x̂, so the prediction depends on
    the prompt (for prompt-CFG tests). Decoding is nearest-codebook: argmax of x·Eᵀ. Every call's
    inputs are recorded.
    """

    def __init__(self, x_hat: torch.Tensor, codebook: torch.Tensor, reg_hat: torch.Tensor | None = None,
                 prompt_gain: float = 0.0):
        self.x_hat, self.codebook, self.reg_hat, self.prompt_gain = x_hat, codebook, reg_hat, prompt_gain
        self.reg_dim = None if reg_hat is None else reg_hat.shape[-1]
        self.denoise_log: list[dict[str, torch.Tensor | None]] = []
        self.decode_log: list[dict[str, torch.Tensor | None]] = []

    def _clone(self, **kw):
        return {k: None if v is None else v.clone() for k, v in kw.items()}

    def prediction(self, z: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        x = self.x_hat[: z.shape[1]].expand_as(z).clone()  # a trimmed canvas holds its first positions
        if self.prompt_gain:
            m = prompt_mask[..., None].float()
            mean = (z * m).sum(1, keepdim=True) / m.sum(1, keepdim=True)
            x = x + self.prompt_gain * mean
        return torch.where(prompt_mask[..., None], z, x)

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.denoise_log.append(self._clone(z=z, q=q, t=t, w=w, prompt_mask=prompt_mask, reg=reg, reg_q=reg_q))
        rh = None if self.reg_hat is None else self.reg_hat.expand(z.shape[0], -1).clone()
        return self.prediction(z, prompt_mask), rh

    def decode(self, x, prompt_mask, reg, w):
        self.decode_log.append(self._clone(x=x, prompt_mask=prompt_mask, reg=reg, w=w))
        ids = (x @ self.codebook.T).argmax(-1)
        return torch.where(prompt_mask, torch.full_like(ids, -1), ids)


class RowAlteringNetwork(FixedNetwork):
    """FixedNetwork whose decodes of the rows listed in ``rows`` are altered by :meth:`alter`,
    given how many times that row has been decoded. Rows are identified by the first prompt state
    feature, set by the test to the row index."""

    def __init__(self, *args, rows: set[int], **kw):
        super().__init__(*args, **kw)
        self.rows = rows
        self.calls: dict[int, int] = {}

    def alter(self, ids: torch.Tensor, answer: torch.Tensor, calls: int) -> None:
        raise NotImplementedError

    def decode(self, x, prompt_mask, reg, w):
        ids = super().decode(x, prompt_mask, reg, w)
        for k in range(x.shape[0]):
            row = int(round(float(x[k, 0, 0])))
            self.calls[row] = self.calls.get(row, 0) + 1
            if row in self.rows:
                self.alter(ids[k], (~prompt_mask[k]).nonzero().squeeze(1), self.calls[row])
        return ids


class ChangingNetwork(RowAlteringNetwork):
    """The decoded answer of each row in ``unstable`` changes on every decode of that row (its first
    answer token differs each time)."""

    def __init__(self, *args, unstable: set[int], **kw):
        super().__init__(*args, rows=unstable, **kw)

    def alter(self, ids, answer, calls):
        ids[answer[0]] = (calls % (self.codebook.shape[0] - 1)) + 1


def make_problem(batch: int = 2, length: int = 10, dim: int = 6, vocab: int = 7, d_r: int | None = 4,
                 prompt_lens: list[int] | None = None, seed: int = 0):
    """Prompt states, masks, a target token row and the matching stub network."""
    g = torch.Generator().manual_seed(seed)
    codebook = torch.randn(vocab, dim, generator=g) * 3
    target = torch.randint(1, vocab, (length,), generator=g)
    x_hat = codebook[target].clone()
    reg_hat = torch.randn(d_r, generator=g) if d_r else None
    prompt_lens = prompt_lens or [2 + (i % 3) for i in range(batch)]
    mask = torch.arange(length)[None, :] < torch.tensor(prompt_lens)[:, None]
    states = torch.randn(batch, length, dim, generator=g)
    states[:, 0, 0] = torch.arange(batch, dtype=torch.float32)  # row tag for ChangingNetwork
    return states, mask, target, x_hat, codebook, reg_hat


class MovingEndNetwork(RowAlteringNetwork):
    """For each row in ``moving`` the first EOS (id ``eos``) of each decode sits one position later
    than in that row's previous decode."""

    def __init__(self, *args, moving: set[int], eos: int, **kw):
        super().__init__(*args, rows=moving, **kw)
        self.eos = eos

    def alter(self, ids, answer, calls):
        ids[answer] = torch.where(ids[answer] == self.eos, 1, ids[answer])
        ids[answer[min(calls, answer.numel() - 1)]] = self.eos
