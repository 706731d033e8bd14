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
    towards 1; about 0.7-1.2 after five steps), computed in fp32. A (k, m, n) stack gives each
    of its k matrices its own (each normed alone)."""
    x = update.float()
    single = x.dim() == 2
    if single:
        x = x[None]
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = newton_schulz_iterations(x / (x.norm(dim=(-2, -1), keepdim=True) + eps), steps)
    if tall:
        x = x.mT
    return x[0] if single else x


def newton_schulz_iterations(x: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """``steps`` iterations X ← aX + (bA + cA²)X, A = XXᵀ, on a (k, m, n) stack of wide (m ≤ n),
    normed fp32 matrices.

    Each iteration is three products: A, then bA + cA² and aX + (bA + cA²)X each as one
    ``baddbmm`` (the scaling and the sum done by the product itself). Written as separate
    products, scalings and sums, the same iterations took 1.28x the time on the demo's student
    (small matrices, whose element-wise passes weigh almost as much as their products); the
    results differ by float rounding (``benchmarks/newton_schulz_ab.py``)."""
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x


STACK_BYTES = 16 * 2**20
"""The most bytes of updates one batched Newton–Schulz call stacks: small matrices gain from
sharing a call; large ones keep the cores busy alone and would only hold more memory at once."""


def stacks(params: list[torch.Tensor], max_bytes: int = STACK_BYTES) -> list[list[torch.Tensor]]:
    """``params`` grouped by shape, dtype and device, groups in first-seen order, each cut into
    stacks of at most ``max_bytes`` (a larger matrix is a stack of its own)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((tuple(p.shape), p.dtype, p.device), []).append(p)
    out = []
    for items in groups.values():
        per_stack = max(1, max_bytes // (items[0].numel() * items[0].element_size()))
        out += [items[i:i + per_stack] for i in range(0, len(items), per_stack)]
    return out


class ElfMuon(torch.optim.Optimizer):
    """ELF's Muon on the matrices and Nesterov-Adam on the rest (see the module docstring).

    ``params`` are split by dimension: 2-D tensors to Muon (with ``weight_decay``), the others to
    Adam (no weight decay, as ELF's). Both groups share ``lr``; a schedule sets it on every group.
    ``stack_bytes`` caps the matrices one Newton–Schulz call orthogonalises together
    (:func:`stacks`; 0: one call per matrix).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.95,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 stack_bytes: int = STACK_BYTES):
        params = [p for p in params if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() == 2], "use_muon": True, "momentum": momentum,
                   "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() != 2], "use_muon": False, "betas": betas, "eps": eps,
                   "weight_decay": 0.0}]
        super().__init__([g for g in groups if g["params"]], {"lr": lr})
        self.stack_bytes = stack_bytes  # not a group setting: checkpoints hold none

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch's contract
        loss = None if closure is None else closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_group(group)
            else:
                self._adam_group(group)
        return loss

    # Each update is written with torch's ``_foreach`` operations over a list of tensors: the
    # same element-wise operations in the same order as one tensor at a time (a CPU runs them
    # tensor by tensor; equal bit for bit, tested), with one Python call a list instead of one
    # a tensor. On the toy demo's student (82 tensors) the Python calls were the step's cost
    # outside Newton–Schulz (docs/performance.md).

    def _count_steps(self, params: list[torch.Tensor]) -> list[tuple[int, list[torch.Tensor]]]:
        """Advance each parameter's step; the parameters grouped by that step, first-seen order
        (one group, unless parameters were added to a running optimiser)."""
        by_step: dict[int, list[torch.Tensor]] = {}
        for p in params:
            state = self.state[p]
            # a tensor, as torch's optimisers keep it (distributed checkpoints shard tensors)
            state["step"] = state.get("step", torch.zeros((), dtype=torch.float32)) + 1
            by_step.setdefault(int(state["step"]), []).append(p)
        return list(by_step.items())

    def _state_list(self, params: list[torch.Tensor], key: str) -> list[torch.Tensor]:
        return [self.state[p].setdefault(key, torch.zeros_like(p)) for p in params]

    @staticmethod
    def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.zeros_like(p) if p.grad is None else p.grad for p in params]

    @staticmethod
    def _apply(params: list[torch.Tensor], updates: list[torch.Tensor], group: dict) -> None:
        """p ← p·(1 − η·λ) (where λ > 0), then p ← p − η·update."""
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        torch._foreach_add_(params, [u.to(p.dtype) for p, u in zip(params, updates, strict=True)],
                            alpha=-group["lr"])

    @staticmethod
    def _bias_corrected(m: list[torch.Tensor], grads: list[torch.Tensor], beta: float, s: int) -> list[torch.Tensor]:
        """The bias-corrected Nesterov momentum β·m/(1 − β^(s+1)) + (1 − β)·g/(1 − β^s)."""
        out = torch._foreach_mul(m, beta)
        torch._foreach_div_(out, 1 - beta ** (s + 1))
        g = torch._foreach_mul(grads, 1 - beta)
        torch._foreach_div_(g, 1 - beta ** s)
        torch._foreach_add_(out, g)
        return out

    def _muon_group(self, group: dict) -> None:
        """Muon on every matrix of ``group``; the Newton–Schulz iterations of same-shaped
        matrices run as one batched product (:func:`stacks`). A transformer's matrices come in a
        few shapes, once per block, and a small model's are small: alone, each product left the
        second core mostly idle (docs/performance.md). Each matrix is still orthogonalised on
        its own (its norm, its products); only the calls are shared. Updates are made a stack at
        a time, so at most one stack of them is held at once."""
        beta = group["momentum"]
        for s, params in self._count_steps(group["params"]):
            for stack in stacks(params, self.stack_bytes):
                grads, momenta = self._grads(stack), self._state_list(stack, "momentum")
                torch._foreach_lerp_(momenta, grads, 1 - beta)
                fan_out, fan_in = stack[0].shape
                ortho = newton_schulz(torch.stack(self._bias_corrected(momenta, grads, beta, s)))
                self._apply(stack, torch._foreach_mul(list(ortho.unbind()), max(1.0, fan_out / fan_in) ** 0.5), group)

    def _adam_group(self, group: dict) -> None:
        """Nesterov-Adam on every tensor of ``group``."""
        (b1, b2), eps = group["betas"], group["eps"]
        for s, params in self._count_steps(group["params"]):
            grads = self._grads(params)
            m, v = self._state_list(params, "exp_avg"), self._state_list(params, "exp_avg_sq")
            torch._foreach_lerp_(m, grads, 1 - b1)
            torch._foreach_lerp_(v, torch._foreach_mul(grads, grads), 1 - b2)
            denominator = torch._foreach_div(v, 1 - b2 ** s)
            torch._foreach_sqrt_(denominator)
            torch._foreach_add_(denominator, eps)
            update = self._bias_corrected(m, grads, b1, s)
            torch._foreach_div_(update, denominator)
            self._apply(params, update, group)
