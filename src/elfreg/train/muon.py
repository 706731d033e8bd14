"""ELF's Muon: the optimiser of ELF's recipe (``train.optimizer: muon``; docs/elf.md).

ELF (arXiv 2605.10938) trains with ``optax.contrib.muon``, reproduced in its PyTorch code
(``utils/muon_utils.py``). elfreg has its own implementation because ``torch.optim.Muon``
differs in what changes training: it orthogonalises in bf16, has no bias correction, scales
steps by another rule, and takes only the matrices it is handed. Per step s = 1, 2, …, with one
learning rate η for both groups:

- **every matrix** (ndim 2): momentum m ← β·m + (1 − β)·g (β = ``momentum``, 0.95), a
  bias-corrected Nesterov step u = β·m/(1 − β^(s+1)) + (1 − β)·g/(1 − β^s), orthogonalised by
  five Newton–Schulz iterations in fp32 (X ← aX + (bA + cA²)X with A = XXᵀ, (a, b, c) =
  (3.4445, −4.7750, 2.0315), after X = u/(‖u‖_F + 1e-8), on the wide orientation), scaled by
  √max(1, fan_out/fan_in) (an ``nn.Linear`` weight is (fan_out, fan_in)); then p ← p·(1 − η·λ)
  and p ← p − η·update;
- **everything else** (biases, norm weights, learned tokens): Nesterov-Adam with β1 0.9,
  β2 0.999, ε 1e-8 and no weight decay: m̂ = β1·m/(1 − β1^(s+1)) + (1 − β1)·g/(1 − β1^s),
  v̂ = v/(1 − β2^s), update m̂/(√v̂ + ε).

A parameter without a gradient in a step is stepped with a zero gradient, as ELF's is (its
moments decay, so it still moves). State per parameter: ``step`` and ``momentum`` (Muon) or
``exp_avg``/``exp_avg_sq`` (Adam); ``state_dict``/``load_state_dict`` are torch's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def newton_schulz(update: torch.Tensor, steps: int = NS_STEPS, eps: float = 1e-8) -> torch.Tensor:
    """An approximately orthogonal matrix of ``update``'s shape (its singular values pushed
    towards 1; about 0.7-1.2 after five steps), computed in fp32."""
    a, b, c = NS_COEFFICIENTS
    x = update.float()
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class ElfMuon(torch.optim.Optimizer):
    """ELF's Muon on the matrices and Nesterov-Adam on the rest (see the module docstring).

    ``params`` are split by dimension: 2-D tensors to Muon (with ``weight_decay``), the others to
    Adam (no weight decay, as ELF's). Both groups share ``lr``; a schedule sets it on every group.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.95,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        params = [p for p in params if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() == 2], "use_muon": True, "momentum": momentum,
                   "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() != 2], "use_muon": False, "betas": betas, "eps": eps,
                   "weight_decay": 0.0}]
        super().__init__([g for g in groups if g["params"]], {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch's contract
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                grad = torch.zeros_like(p) if p.grad is None else p.grad
                state = self.state[p]
                # a tensor, as torch's optimisers keep it (distributed checkpoints shard tensors)
                state["step"] = state.get("step", torch.zeros((), dtype=torch.float32)) + 1
                update = self._muon(p, grad, state, group) if group["use_muon"] else self._adam(grad, state, group)
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-group["lr"])
        return loss

    @staticmethod
    def _muon(p: torch.Tensor, grad: torch.Tensor, state: dict, group: dict) -> torch.Tensor:
        beta, s = group["momentum"], int(state["step"])
        m = state.setdefault("momentum", torch.zeros_like(p))
        m.lerp_(grad, 1 - beta)
        nesterov = beta * m / (1 - beta ** (s + 1)) + (1 - beta) * grad / (1 - beta ** s)
        fan_out, fan_in = p.shape
        return newton_schulz(nesterov) * max(1.0, fan_out / fan_in) ** 0.5

    @staticmethod
    def _adam(grad: torch.Tensor, state: dict, group: dict) -> torch.Tensor:
        (b1, b2), s = group["betas"], int(state["step"])
        m = state.setdefault("exp_avg", torch.zeros_like(grad))
        v = state.setdefault("exp_avg_sq", torch.zeros_like(grad))
        m.lerp_(grad, 1 - b1)
        v.lerp_(grad.square(), 1 - b2)
        m_hat = b1 * m / (1 - b1 ** (s + 1)) + (1 - b1) * grad / (1 - b1 ** s)
        return m_hat / ((v / (1 - b2 ** s)).sqrt() + group["eps"])
