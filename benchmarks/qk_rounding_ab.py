"""Before/after of one change, measured side by side: the attention block's qk-norm and RoPE with
one rounding to the compute dtype (``elfreg.model.blocks.Attention.qkv_heads``, the "after")
against the composition it replaced, which rounded q and k to bf16 between the norm and the
rotation (the "before", written out below). Both run in the same process on the same bf16
network (the ELF-REG-B shape of ``run.py``), swapped in call by call and timed interleaved.

    python benchmarks/qk_rounding_ab.py --batches 1 8 --repeats 7

In fp32 the two give the same values bit for bit (``tests/model/test_model_blocks.py`` checks
the single rounding under bf16); this script measures only their speed.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from elfreg.model import blocks

import run
from perf import sample
from perf.common import timed


def _rope_rounding_twice(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[None, None], sin[None, None]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def before(self: blocks.Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The forward before the change: qk-norm rounds to bf16, RoPE converts back to fp32."""
    b, s, _ = x.shape
    q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
    q = _rope_rounding_twice(self.q_norm(q), cos, sin)
    k = _rope_rounding_twice(self.k_norm(k), cos, sin)
    out = F.scaled_dot_product_attention(q, k, v.to(q.dtype))
    return self.proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    device = torch.device("cpu")
    net = sample._student_network(run.B, "bf16", device)
    forwards = {"before": before, "after": blocks.Attention.forward}
    for batch in args.batches:
        x = sample._inputs(run.B, batch, device)
        q = torch.zeros_like(x["z"])

        def call(x=x, q=q) -> None:
            net.denoise(x["z"], q, x["t"], x["w"], x["prompt_mask"], x["reg"], None)

        times: dict[str, list[float]] = {name: [] for name in forwards}
        for rnd in range(args.repeats + 1):  # round 0 warms up
            for name, forward in forwards.items():
                blocks.Attention.forward = forward
                seconds = timed(call, device)
                if rnd:
                    times[name].append(seconds)
        blocks.Attention.forward = forwards["after"]
        med = {name: statistics.median(ts) for name, ts in times.items()}
        print(f"elf-reg-b denoise, batch {batch}, bf16, median of {args.repeats}: before {med['before'] * 1e3:.1f} ms, "
              f"after {med['after'] * 1e3:.1f} ms, before / after {med['before'] / med['after']:.3f}")


if __name__ == "__main__":
    main()
