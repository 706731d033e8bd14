"""FLOPs of a call: torch's ``FlopCounterMode`` plus the CPU attention kernel it does not know,
split into matmul and attention FLOPs.

torch's counter has formulas for the CUDA attention kernels (flash, memory-efficient, cuDNN) but
not for the CPU one (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), so on a
CPU every attention FLOP went uncounted and every floor was too low: about 5 % of an ELF-REG-B
denoise call at canvas 256. Here the CPU kernel is counted with torch's own SDPA formulas (two
batched matmuls forward, QKᵀ and PV; five backward), the same numbers the CUDA kernels get.
Elementwise work (norms, activations, softmax, copies) is not counted on any device.

Attention is SDPA's kernel, or, in a CPU bf16 call without gradient, two batched matmuls
(``elfreg.model.blocks.softmax_attention``): the student's linear layers run as ``mm``/``addmm``,
so its ``bmm`` FLOPs are attention FLOPs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# FlopCounterMode calls these with the shapes of the op's tensor arguments
CPU_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward}


def is_attention_op(name: str) -> bool:
    """An attention op with FLOPs, by its name as the profiler (``aten::…``) or the FLOP counter
    (``aten.…``) gives it: an SDPA kernel or ``bmm``."""
    return "scaled_dot_product" in name or name in ("aten::bmm", "aten.bmm", "aten.bmm.default")


def flop_counter() -> FlopCounterMode:
    """A ``FlopCounterMode`` that also counts the CPU attention kernel."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)


def split(counter: FlopCounterMode) -> dict[str, float]:
    """``total``, ``attention`` and ``matmul`` (everything counted that is not attention) FLOPs."""
    by_op = counter.get_flop_counts().get("Global", {})
    attention = sum(n for op, n in by_op.items() if is_attention_op(str(op)))
    total = float(counter.get_total_flops())
    return {"total": total, "attention": float(attention), "matmul": total - attention}


def count(fn: Callable[[], Any]) -> dict[str, float]:
    """FLOPs of one call of ``fn`` (:func:`split`)."""
    with flop_counter() as counter:
        fn()
    return split(counter)
