"""One batch of the trajectory analysis: the sampling runs and one row per (problem, seed).

For each seed, the batch's prompts go through :func:`elfreg.sampling.generate` twice, each time
the one sampler loop of the sampling room with trajectory recording:

1. the **master trajectory**: early-stop with budget N = M and ρ = 1, i.e. all M − 1 denoiser
   calls on the master grid of M points drawn from the seed. Its grid, noise and path are the
   same as those of early-stop at any budget N with ρ = M/N (the master grid depends only on M
   and the seed), so the readout at NFE N — the recorded decode of d_{N−2}, step j = N − 2 — is
   exactly what ``elfreg sample --nfe N --rho M/N`` answers. Only the observation steps are
   recorded (``record_steps``);
2. with ``uniform`` > 0, the **uniform-grid trajectory**: full-span with ``uniform`` points
   (h = 1/(uniform − 1)), every step recorded, for the joint acceleration and Prop. 1.

Prop. 2 decodes the recorded clean predictions once more (uncounted) to read the decoder's
hidden states h, the input of its vocabulary head (see :func:`decoder_stability`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config import SampleConfig
from ..device import use_bf16
from ..sampling import generate
from ..sampling.generation import GenerationResult, SamplingModels, answer_text, answer_token_ids
from ..sampling.network import StudentNetwork
from ..sampling.steps import euler_update
from ..sampling.trajectory import Trajectory
from . import trajectory_metrics as tm

#: answer positions whose logits are held at once when reading margins
MARGIN_CHUNK = 64


@dataclass(frozen=True)
class Plan:
    """What one analysis measures. ``observe`` are the saved observations as NFE budgets
    (increasing, ending at ``master``): every NFE of ``nfes``, every ``observe_every``-th NFE
    and the endpoint; the readout at NFE N is observation step N − 2."""

    master: int
    nfes: tuple[int, ...]
    observe: tuple[int, ...]
    flip_nfe: int
    uniform: int

    @classmethod
    def make(cls, master: int, nfes: Sequence[int], observe_every: int = 0, flip_nfe: int | None = None,
             uniform: int = 0) -> Plan:
        if master < 2:
            raise ValueError(f"--master must be >= 2; got {master}")
        nfes = tuple(sorted(set(nfes)))
        if not nfes or nfes[0] < 2 or nfes[-1] > master:
            raise ValueError(f"every NFE must be in [2, master = {master}]; got {list(nfes)}")
        if observe_every < 0:
            raise ValueError(f"--observe-every must be >= 0; got {observe_every}")
        if uniform and uniform < 3:
            raise ValueError(f"--acceleration needs at least 3 grid points (0: off); got {uniform}")
        early = [n for n in nfes if n < master]
        if flip_nfe is None:
            if not early:
                raise ValueError(f"flips need an NFE below the master budget {master}; got {list(nfes)}")
            flip_nfe = 64 if 64 in early else early[-1]
        if flip_nfe not in early:
            raise ValueError(f"--flip-nfe must be one of the NFEs below the master budget: {early}; got {flip_nfe}")
        extra = range(observe_every, master, observe_every) if observe_every else ()
        observe = tuple(sorted({*nfes, *(n for n in extra if n >= 2), master}))
        return cls(master, nfes, observe, flip_nfe, uniform)

    @property
    def reported(self) -> tuple[int, ...]:
        """The NFEs of the table: ``nfes`` and the endpoint M."""
        return tuple(sorted({*self.nfes, self.master}))


def master_sample(sample: SampleConfig, master: int) -> SampleConfig:
    """Early-stop over the whole master grid of M points: budget M, ρ = 1."""
    return sample.replace(sampler="early-stop", nfe=master, rho=1)


def _prompt_states(models: SamplingModels, prompts: list[str], device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    canvas = models.frozen.canvas.build(prompts)
    return models.frozen.encoder.encode_canvas(canvas).to(device).float(), canvas.prompt_mask.to(device)


def decoder_stability(net: StudentNetwork, states: torch.Tensor, mask: torch.Tensor, tr: Trajectory,
                      rows: list[int], w: float, span: int) -> tuple[list[float], float]:
    """Prop. 2 on the decoder head for one trajectory: (e for each observation row of ``rows``,
    m). The clean predictions d_j of ``rows`` and of the endpoint (the last row) are decoded
    again; h_i are the decode-mode hidden states at the first ``span`` answer positions.

    e = max_i ‖h_i(d_j) − h_i(d_{M−2})‖ and m = min_i of the endpoint's logit margin (winner
    minus best competitor) over those positions: the answer and its first EOS.
    """
    picks = [*rows, len(tr) - 1]
    k = len(picks)
    x = states.expand(k, *states.shape).clone()
    x[:, ~mask] = tr.predictions[picks].to(x)
    reg = None if tr.reg_predictions is None else tr.reg_predictions[picks].to(x)
    hidden = net.decode_hidden(x, mask.expand(k, -1), reg, torch.full((k,), w, device=x.device)).float()
    h = hidden[:, ~mask][:, :span]
    errors = (h[:-1] - h[-1]).double().norm(dim=-1).amax(dim=1)
    with torch.no_grad():
        margins = torch.cat([tm.logit_margin(net.student.decode_logits(h[-1, i:i + MARGIN_CHUNK]))
                             for i in range(0, span, MARGIN_CHUNK)])
    return errors.tolist(), float(margins.min())


def acceleration_row(tr: Trajectory, c_min: float) -> dict[str, list[float]]:
    """Prop. 1 along one uniform-grid trajectory y_0 … y_{K−1} (K = grid points; joint text + REG).

    ``a``: ‖a_{t_k}‖ at k = 1 … K−2 (second differences, :func:`~.trajectory_metrics.joint_acceleration`);
    for k = 0 … K−2: ``A`` = the largest remaining acceleration max_{j ≥ max(k, 1)} ‖a_{t_j}‖ and
    ``error`` = ‖e_{t_k}‖ = ‖(d_k, r̂_k) − (y_{K−1}, r_{K−1})‖, the clean prediction against the
    trajectory's own endpoint (Eq. 13's left side).
    """
    t = tr.times.double()
    ones = torch.ones(1, dtype=torch.float64)
    text_end = euler_update(tr.states[-1:].double(), tr.predictions[-1:].double(), t[-1:], ones, c_min)
    parts = [torch.cat([tr.states.double(), text_end]).flatten(1)]
    err = (tr.predictions.double() - text_end).flatten(1).pow(2).sum(1)
    if tr.reg_states is not None:
        reg_end = euler_update(tr.reg_states[-1:].double(), tr.reg_predictions[-1:].double(), t[-1:], ones, c_min)
        parts.append(torch.cat([tr.reg_states.double(), reg_end]))
        err = err + (tr.reg_predictions.double() - reg_end).pow(2).sum(1)
    accel = tm.joint_acceleration(torch.cat(parts, dim=1), torch.cat([t, ones]))
    remaining = tm.remaining_max(accel)
    return {"a": accel.tolist(), "A": [float(remaining[0]), *remaining.tolist()], "error": err.sqrt().tolist()}


def _readout(tr: Trajectory, s: int, end: torch.Tensor, eos: int, tokenizer: Any) -> dict[str, Any]:
    pred, r_pred = tr.predictions[s], None if tr.reg_predictions is None else tr.reg_predictions[s]
    joint = float(tm.endpoint_error_norm(pred, end)) ** 2
    if r_pred is not None:
        joint += float((r_pred.double() - tr.reg_predictions[-1].double()).norm()) ** 2
    return {"t": float(tr.times[s]), "endpoint_error": float(tm.text_endpoint_error(pred, end)),
            "endpoint_error_norm": float(tm.endpoint_error_norm(pred, end)), "joint_error": joint ** 0.5,
            "exact": tm.exact_agreement(tr.tokens[s], tr.final_tokens, eos),
            "text": answer_text(tokenizer, answer_token_ids(tr.tokens[s], eos))}


def pair_row(master: GenerationResult, uniform: GenerationResult | None, plan: Plan, eos: int,
              tokenizer: Any, c_min: float) -> dict[str, Any]:
    """The unscored row of one (problem, seed): every reported NFE's readout against the endpoint."""
    tr = master.trajectory
    expected = [n - 2 for n in plan.observe]
    if tr.steps.tolist() != expected:
        raise RuntimeError(f"the master trajectory recorded steps {tr.steps.tolist()}, expected {expected}")
    end, end_tokens = tr.predictions[-1], tr.final_tokens
    span = tm.answer_span(end_tokens, eos)
    stable = tm.stable_token_fraction(tr.tokens, end_tokens, span)
    answer, has_eos = tm.answer_of(end_tokens, eos)
    row: dict[str, Any] = {"endpoint": {"text": master.text, "answer_len": len(answer), "eos": has_eos,
                                        "span": span}, "nfe": {}}
    for n in plan.reported:
        s = plan.observe.index(n)
        row["nfe"][str(n)] = {**_readout(tr, s, end, eos, tokenizer), "stable": float(stable[s])}
    if uniform is not None:
        row["acceleration"] = acceleration_row(uniform.trajectory, c_min)
    return row


def measure_batch(models: SamplingModels, prompts: list[str], seed: int, plan: Plan, sample: SampleConfig, *,
                  batch_size: int, precision: str) -> list[dict[str, Any]]:
    """Unscored rows (see :func:`pair_row`) with Prop. 2's ``prop2`` for ``prompts`` at ``seed``."""
    common = dict(seed=seed, batch_size=batch_size, precision=precision, progress=False)
    masters = generate(models, prompts, master_sample(sample, plan.master),
                       record_steps=[n - 2 for n in plan.observe], **common)
    uniforms: list[GenerationResult | None] = [None] * len(prompts)
    if plan.uniform:
        uniforms = generate(models, prompts, sample.replace(sampler="full-span", nfe=plan.uniform,
                                                            full_span_grid="uniform"),
                            record_every=1, **common)
    tokenizer, eos, c_min = models.frozen.tokenizer, models.frozen.tokenizer.eos_token_id, models.config.flow.c_min
    device = next(models.student.parameters()).device
    net = StudentNetwork(models.student, use_bf16(device, precision), eos_id=eos)
    states, masks = _prompt_states(models, prompts, device)
    rows = []
    for b, (m, u) in enumerate(zip(masters, uniforms, strict=True)):
        row = pair_row(m, u, plan, eos, tokenizer, c_min)
        early = [n for n in plan.nfes if n < plan.master]
        errors, margin = decoder_stability(net, states[b], masks[b], m.trajectory,
                                           [plan.observe.index(n) for n in early], sample.sc_cfg,
                                           row["endpoint"]["span"])
        row["prop2"] = {"margin": margin, "error": {str(n): e for n, e in zip(early, errors, strict=True)}}
        rows.append(row)
    return rows


def head_lipschitz(models: SamplingModels) -> float:
    """L of Prop. 2 for the decoder head (``dec_proj``, GELU, ``vocab_head``):
    :func:`~.trajectory_metrics.gelu_head_logit_lipschitz`."""
    student = models.student
    return tm.gelu_head_logit_lipschitz(student.dec_proj.weight, student.vocab_head.weight)
