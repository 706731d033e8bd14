"""Where a network call's time goes: matmuls, attention and everything else, the first two
against their own FLOP floor.

A call's "× floor" (``sample.per_call``) says how far the whole call is from the machine; this
says which ops account for the gap. One call runs under ``torch.profiler``; the self time of each
aten op (CPU time on a CPU, kernel time on CUDA) is summed into three groups:

- **matmul**: ``mm``, ``addmm`` (the kernels under ``linear``);
- **attention**: the scaled-dot-product attention kernels, or their two batched matmuls (``bmm``)
  and softmax where a CPU bf16 call runs attention as those (:mod:`perf.flops`);
- **other**: every other op (norms, RoPE, activations, casts, copies, indexing, reductions).

A group's "× floor" is its seconds over its FLOPs (:mod:`perf.flops`) at the probe's GFLOP/s:
1.0 would be a matmul as fast as the large square probe. The profiler adds a little time per op,
so the groups' shares, not their absolute seconds, are the result; ``unattributed_seconds`` is
the profiled call's wall time outside any aten op (Python, dispatch; on CPU only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from .common import synchronize
from .flops import is_attention_op

MATMUL_OPS = frozenset({"aten::mm", "aten::addmm"})
SOFTMAX_OPS = frozenset({"aten::_softmax", "aten::softmax"})
GROUPS = ("matmul", "attention", "other")


def group_of(op_name: str) -> str:
    """The group an aten op's self time is counted in."""
    if op_name in MATMUL_OPS:
        return "matmul"
    return "attention" if is_attention_op(op_name) or op_name in SOFTMAX_OPS else "other"


def time_breakdown(fn: Callable[[], Any], flops: dict[str, float], probe_gflops: float,
                   device: torch.device) -> dict[str, Any]:
    """Profile one call of ``fn`` (warm: call it once before) and split its op time into
    :data:`GROUPS`; ``flops`` is :func:`perf.flops.count` of the same call."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    wall = time.perf_counter() - start
    seconds = dict.fromkeys(GROUPS, 0.0)
    for event in prof.key_averages():
        us = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        seconds[group_of(event.key)] += us * 1e-6
    ops = sum(seconds.values())
    out: dict[str, Any] = {"profiled_seconds": wall, "op_seconds": ops}
    if device.type != "cuda":  # kernel time on CUDA overlaps the host's; a difference means nothing
        out["unattributed_seconds"] = wall - ops
    for group in GROUPS:
        row: dict[str, float] = {"seconds": seconds[group], "share": seconds[group] / ops if ops else 0.0}
        group_flops = flops.get(group, 0.0)
        if group_flops and seconds[group]:
            row["flops"] = group_flops
            row["over_floor"] = seconds[group] / (group_flops / (probe_gflops * 1e9))
        out[group] = row
    return out
