"""Pure metrics of the trajectory analysis (ELF-REG §5.2; the paper's Fig. 2, Table 11, Table 13 and
Propositions 1–2). Every function takes plain tensors or values and names the quantity it
computes; nothing here samples, loads or scores.

Symbols. One *master trajectory* follows the early-stop master grid of M points
t_0 = 0 < t_1 ≤ … ≤ t_{M−1} = 1 (ELF-REG §3, App. C). Network call j + 1 (j = 0 … M−2) is made at t_j and
gives the clean prediction d_j (text, answer region (A, d)) and r̂_j (REG). The early-stopped
readout at budget N is D(d_{N−2}), the decode of the clean prediction after the first N − 1
denoiser calls (N NFE with the decode); the *endpoint* is the readout at N = M, D(d_{M−2}).
The sampler's final state is y_{M−1} = y_{M−2} + (1 − t_{M−2})·v_{M−2}, which equals d_{M−2}
whenever 1 − t_{M−2} ≥ c_min (the first term of Eq. 13 vanishes), so d_{M−2} is the endpoint
of the whole trajectory. *Observations* s = 0 … S−1 are the saved steps of the trajectory in
increasing order; the last one is the endpoint.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch

__all__ = [
    "answer_agreement",
    "answer_of",
    "answer_span",
    "endpoint_error_norm",
    "exact_agreement",
    "gelu_head_logit_lipschitz",
    "joint_acceleration",
    "logit_margin",
    "pairwise_logit_lipschitz",
    "paired_flips",
    "prop1_holds",
    "prop2_holds",
    "remaining_max",
    "second_differences",
    "stable_token_fraction",
    "text_endpoint_error",
]


def endpoint_error_norm(pred: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """‖d_j − d_{M−2}‖: the Frobenius norm of the difference over the last two dimensions
    (answer positions × features); leading dimensions are kept (one value per observation)."""
    diff = (pred.double() - end.double()).flatten(-2)
    return diff.norm(dim=-1)


def text_endpoint_error(pred: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """The *text endpoint error* of Fig. 2(b): the distance of the clean prediction at an NFE to
    the endpoint prediction of the same master trajectory, over the answer region.

    The paper (Fig. 2(b), Table 11) calls it the "text endpoint error" of the readout at N
    against the 512-NFE endpoint and does not state a normalisation. This implementation uses
    the relative error

        ‖d_{N−2} − d_{M−2}‖_F / ‖d_{M−2}‖_F

    over every answer position (EOS padding included: it is part of the generated state) and
    every feature, so that 1.0 is an error as large as the endpoint itself and N = M gives 0 by
    construction. ``pred`` is (…, A, d), ``end`` is (A, d); returns one value per leading index.
    """
    scale = end.double().flatten().norm().clamp_min(torch.finfo(torch.float64).tiny)
    return endpoint_error_norm(pred, end) / scale


def answer_span(end_tokens: torch.Tensor, eos_id: int) -> int:
    """Positions of the endpoint's answer *and its first EOS* (all A when it has no EOS): the
    positions Prop. 2's margin covers and over which stable tokens are counted."""
    hits = (end_tokens == eos_id).nonzero()
    return int(hits[0, 0]) + 1 if hits.numel() else int(end_tokens.numel())


def stable_token_fraction(tokens: torch.Tensor, end_tokens: torch.Tensor, span: int) -> torch.Tensor:
    """Fraction of *stable tokens* at each observation: a position is stable at observation s
    when its token equals the endpoint token at s **and at every later observation** s' > s.

    ``tokens`` (S, A) are the decoded rows of the observations in time order, ``end_tokens``
    (A,) the endpoint's; positions ``0 … span−1`` are counted (:func:`answer_span`). Returns (S,)
    floats, non-decreasing in s, and 1.0 at an observation equal to the endpoint when all later
    ones are too (the last observation, the endpoint itself, is always 1.0).
    """
    if span < 1:
        raise ValueError(f"span must be >= 1; got {span}")
    same = tokens[:, :span] == end_tokens[:span]
    # stable[s] = same[s] ∧ same[s+1] ∧ … ∧ same[S−1]: a reversed running AND
    stable = same.flip(0).long().cumprod(0).flip(0).bool()
    return stable.double().mean(dim=1)


def answer_of(tokens: torch.Tensor | Sequence[int], eos_id: int) -> tuple[tuple[int, ...], bool]:
    """(the answer: ids before the first EOS, whether an EOS ends it) of one decoded row."""
    ids = [int(i) for i in tokens if int(i) >= 0]
    if eos_id in ids:
        return tuple(ids[: ids.index(eos_id)]), True
    return tuple(ids), False


def exact_agreement(tokens: torch.Tensor | Sequence[int], end_tokens: torch.Tensor | Sequence[int],
                    eos_id: int) -> bool:
    """*Exact full-answer agreement*: the readout and the endpoint have the same token sequence,
    the same EOS status and the same length (compared now only, unlike stable tokens)."""
    return answer_of(tokens, eos_id) == answer_of(end_tokens, eos_id)


def answer_agreement(extracted: Hashable | None, end_extracted: Hashable | None) -> bool:
    """*Answer agreement* (Table 11's numeric-answer agreement): the task's extractor reads the
    same answer from the readout and from the endpoint. Two outputs from which nothing can be
    extracted agree too (both give "no answer")."""
    return extracted == end_extracted


def paired_flips(early_correct: Sequence[bool], end_correct: Sequence[bool]) -> dict[str, int]:
    """Paired outcomes of the early-stopped readout and the full-trajectory endpoint, one pair
    per (problem, seed): ``wrong_to_right`` = wrong early, right at the endpoint (continuing the
    trajectory fixes it), ``right_to_wrong`` the reverse, and the two unchanged counts."""
    if len(early_correct) != len(end_correct):
        raise ValueError(f"{len(early_correct)} early outcomes for {len(end_correct)} endpoint outcomes")
    pairs = list(zip(map(bool, early_correct), map(bool, end_correct), strict=True))
    return {"wrong_to_right": sum(not e and f for e, f in pairs), "right_to_wrong": sum(e and not f for e, f in pairs),
            "both_right": sum(e and f for e, f in pairs), "both_wrong": sum(not e and not f for e, f in pairs),
            "n": len(pairs)}


def second_differences(states: torch.Tensor, h: float) -> torch.Tensor:
    """(y_{k+1} − 2·y_k + y_{k−1}) / h² for k = 1 … K−2: the finite-difference acceleration of a
    path sampled every h. ``states`` is (K, …); returns (K−2, …) in float64."""
    if states.shape[0] < 3:
        raise ValueError(f"second differences need at least 3 states; got {states.shape[0]}")
    if h <= 0:
        raise ValueError(f"the grid step must be > 0; got {h}")
    y = states.double()
    return (y[2:] - 2 * y[1:-1] + y[:-2]) / (h * h)


def joint_acceleration(states: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """‖a_{t_k}‖, k = 1 … K−2: the norm of the joint acceleration (Prop. 1's
    a_s = ∂_s v + J_y v · v along the path) by second differences of the joint state
    (text + REG, flattened to (K, D)) on a *uniform* grid ``times`` (K,).

    On the Euler path y_{k+1} = y_k + h·v_k this is (v_k − v_{k−1})/h, the change of the
    followed velocity per unit time.
    """
    times = times.double()
    steps = times.diff()
    h = float(steps.mean())
    if not torch.allclose(steps, torch.full_like(steps, h), rtol=1e-6, atol=1e-12):
        raise ValueError("joint_acceleration needs a uniform time grid")
    return second_differences(states.flatten(1), h).norm(dim=1)


def remaining_max(values: torch.Tensor) -> torch.Tensor:
    """A_k = max_{j ≥ k} values_j: the largest value at or after each index (Prop. 1's A for the
    rest of the path when ``values`` are acceleration norms in time order)."""
    return values.flip(0).cummax(0).values.flip(0)


def prop1_holds(error: torch.Tensor, accel_max: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Prop. 1's bound ‖e_t‖ ≤ A·(1 − t)²/2, elementwise (``accel_max`` = A, the largest
    remaining acceleration after t)."""
    return error.double() <= accel_max.double() * (1 - t.double()).pow(2) / 2


def logit_margin(logits: torch.Tensor) -> torch.Tensor:
    """The winning token's logit minus the best competitor's, per row of (P, V) logits."""
    top = logits.double().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def pairwise_logit_lipschitz(matrices: Sequence[torch.Tensor]) -> float:
    """A Lipschitz constant L of every pairwise logit difference ℓ_a − ℓ_b of an affine head
    h ↦ W_k ⋯ W_1·h + b: L = √2·σ_max(W_k ⋯ W_1), since ‖w_a − w_b‖ = ‖(e_a − e_b)ᵀW‖ ≤ √2·σ_max(W).

    ``matrices`` are the weights (out × in, as in ``nn.Linear``) in the order they are applied;
    σ_max comes from the Gram matrix on the input side, so a large vocabulary is never
    multiplied out.
    """
    if not matrices:
        raise ValueError("give at least one weight matrix")
    last = matrices[-1].detach().float()
    gram = (last.T @ last).double()  # (W_k)ᵀW_k; then Pᵀ P = W_1ᵀ ⋯ (W_kᵀ W_k) ⋯ W_1, inner side first
    for w in reversed(matrices[:-1]):
        w = w.detach().double()
        gram = w.T @ gram @ w
    return math.sqrt(2.0) * math.sqrt(max(float(torch.linalg.eigvalsh(gram).max()), 0.0))


# The largest slope of the tanh-approximated GELU, max_x d/dx gelu_tanh(x) (reached near x = 1.4185):
# a Lipschitz constant of the activation between the decoder head's two layers.
GELU_TANH_SLOPE = 1.1289931


def gelu_head_logit_lipschitz(w_in: torch.Tensor, w_out: torch.Tensor) -> float:
    """A Lipschitz constant L of every pairwise logit difference of the head
    h ↦ W_out·gelu_tanh(W_in·h + b_in) + b_out (the decoder D of ELF's network):
    L = √2·σ_max(W_out)·max|gelu'|·σ_max(W_in). Weights are out × in, as in ``nn.Linear``."""
    return pairwise_logit_lipschitz([w_out]) * GELU_TANH_SLOPE * pairwise_logit_lipschitz([w_in]) / math.sqrt(2.0)


def prop2_holds(lipschitz: float, error: torch.Tensor | float, margin: torch.Tensor | float) -> torch.Tensor:
    """Prop. 2's decode-stability condition L·‖e_t‖ < m, elementwise."""
    return torch.as_tensor(lipschitz * torch.as_tensor(error, dtype=torch.float64)) < torch.as_tensor(
        margin, dtype=torch.float64)
