"""Trajectory recording: what a sampler saw and predicted at each step (ELF-REG §3-4, App. C).

One :class:`Trajectory` per sample. Row ``s`` of every per-step tensor belongs to recorded step
``steps[s]`` (the network-call index j = 0, 1, …):

==================  ==============  ==========================================================
field               shape           meaning
==================  ==============  ==========================================================
``steps``           (S,) long       step index j of each record
``times``           (S,) float64    t_j, the time fed to the network at that step
``states``          (S, A, d)       the network input at step j on the answer region: y_j for
                                    the Euler samplers (Eq. 12), z_i for re-noising
``predictions``     (S, A, d)       the clean prediction d_j (x̂) on the answer region
``tokens``          (S, A) long     argmax decode of d_j (decode mode, REG input r̂_j)
``reg_states``      (S, d_r)        REG part of the input (None without a REG token)
``reg_predictions`` (S, d_r)        r̂_j (None without a REG token)
``final_tokens``    (A,) long       argmax of the decode the sampler returned
==================  ==============  ==========================================================

A = canvas length − prompt length: answer positions only (the prompt holds the clean prompt
states at every step). Token rows are the raw argmax over the whole answer region; the answer is
the prefix before the first EOS. Decoding for a recording goes to the unwrapped network: it is
not counted as NFE and changes nothing in the sampled result. ``every`` = k records steps
0, k, 2k, …, ``steps`` records the steps it names (both may be given; ``every`` = 0 with
``steps`` records only those), and the last step of the sample is always recorded.

Files are safetensors (tensors) with the scalar fields in the metadata:
``Trajectory.load(path)`` reads what ``save(path)`` wrote.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .network import Network

_TENSORS = ("steps", "times", "states", "predictions", "tokens", "reg_states", "reg_predictions", "final_tokens")


@dataclass
class Trajectory:
    sampler: str
    seed: int
    prompt_len: int
    nfe: int  # network calls the sample used (recording decodes excluded)
    steps: torch.Tensor
    times: torch.Tensor
    states: torch.Tensor
    predictions: torch.Tensor
    tokens: torch.Tensor
    reg_states: torch.Tensor | None = None
    reg_predictions: torch.Tensor | None = None
    final_tokens: torch.Tensor | None = None
    info: dict[str, float | int | str] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.steps.numel())

    def save(self, path: str | Path) -> None:
        tensors = {k: getattr(self, k).contiguous() for k in _TENSORS if getattr(self, k) is not None}
        meta = {"sampler": self.sampler, "seed": str(self.seed), "prompt_len": str(self.prompt_len),
                "nfe": str(self.nfe), "info": json.dumps(self.info), "format": "elfreg-trajectory-1"}
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != "elfreg-trajectory-1":
            raise ValueError(f"{path} is not an elfreg trajectory file")
        tensors = load_file(str(path))
        return cls(sampler=meta["sampler"], seed=int(meta["seed"]), prompt_len=int(meta["prompt_len"]),
                   nfe=int(meta["nfe"]), info=json.loads(meta.get("info", "{}")),
                   **{k: tensors.get(k) for k in _TENSORS})


class TrajectoryRecorder:
    """Collects per-step records for a batch of samples (see the module docstring)."""

    def __init__(self, net: Network, prompt_mask: torch.Tensor, w: torch.Tensor, every: int = 1,
                 steps: Collection[int] = ()):
        if every < 0 or (every == 0 and not steps):
            raise ValueError(f"record_every must be >= 1 (or 0 with record_steps); got {every}")
        if any(s < 0 for s in steps):
            raise ValueError(f"record_steps must be >= 0; got {sorted(steps)}")
        self.net, self.prompt_mask, self.w, self.every = net, prompt_mask, w, every
        self.steps = frozenset(int(s) for s in steps)
        n = prompt_mask.shape[0]
        self._records: list[list[dict[str, torch.Tensor | int | float]]] = [[] for _ in range(n)]
        self._pending: list[dict | None] = [None] * n
        self.final_ids: list[torch.Tensor | None] = [None] * n

    def observe(self, rows: torch.Tensor, step: int, t: torch.Tensor, state: torch.Tensor, pred: torch.Tensor,
                reg_state: torch.Tensor | None, reg_pred: torch.Tensor | None) -> None:
        """Step ``step`` of the samples ``rows``: inputs, times and clean predictions (row-aligned)."""
        for k, r in enumerate(rows.tolist()):
            self._pending[r] = {"step": step, "t": float(t[k]), "state": state[k], "pred": pred[k],
                                "reg_state": None if reg_state is None else reg_state[k],
                                "reg_pred": None if reg_pred is None else reg_pred[k]}
        if (self.every and step % self.every == 0) or step in self.steps:
            self._commit(rows.tolist())

    def final(self, rows: torch.Tensor, ids: torch.Tensor) -> None:
        """The argmax rows (B', L) the sampler returned for ``rows``."""
        for k, r in enumerate(rows.tolist()):
            self.final_ids[r] = ids[k].detach().cpu()

    def _commit(self, rows: list[int]) -> None:
        rows = [r for r in rows if self._pending[r] is not None]
        if not rows:
            return
        recs = [self._pending[r] for r in rows]
        idx = torch.tensor(rows, device=self.prompt_mask.device)
        pred = torch.stack([rec["pred"] for rec in recs])
        reg = None if recs[0]["reg_pred"] is None else torch.stack([rec["reg_pred"] for rec in recs])
        ids = self.net.decode(pred, self.prompt_mask[idx], reg, self.w[idx])
        for k, (r, rec) in enumerate(zip(rows, recs, strict=True)):
            keep = ~self.prompt_mask[r]
            self._records[r].append({
                "step": rec["step"], "t": rec["t"],
                "state": rec["state"][keep].detach().float().cpu(),
                "pred": rec["pred"][keep].detach().float().cpu(),
                "tokens": ids[k][keep].detach().cpu(),
                "reg_state": None if rec["reg_state"] is None else rec["reg_state"].detach().float().cpu(),
                "reg_pred": None if rec["reg_pred"] is None else rec["reg_pred"].detach().float().cpu(),
            })
            self._pending[r] = None

    def trajectories(self, sampler: str, seeds: list[int], nfe: torch.Tensor,
                     info: list[dict] | None = None) -> list[Trajectory]:
        """Flush the last step of every sample and return one :class:`Trajectory` per sample."""
        self._commit(list(range(len(self._records))))
        out = []
        for r, recs in enumerate(self._records):
            keep = ~self.prompt_mask[r]
            has_reg = bool(recs) and recs[0]["reg_pred"] is not None
            final = self.final_ids[r]
            out.append(Trajectory(
                sampler=sampler, seed=int(seeds[r]), prompt_len=int((~keep).sum()), nfe=int(nfe[r]),
                steps=torch.tensor([rec["step"] for rec in recs], dtype=torch.long),
                times=torch.tensor([rec["t"] for rec in recs], dtype=torch.float64),
                states=torch.stack([rec["state"] for rec in recs]),
                predictions=torch.stack([rec["pred"] for rec in recs]),
                tokens=torch.stack([rec["tokens"] for rec in recs]),
                reg_states=torch.stack([rec["reg_state"] for rec in recs]) if has_reg else None,
                reg_predictions=torch.stack([rec["reg_pred"] for rec in recs]) if has_reg else None,
                final_tokens=None if final is None else final[keep.cpu()],
                info=dict(info[r]) if info else {},
            ))
        return out
