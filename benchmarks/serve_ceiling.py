"""What bounds continuous batching on this machine: a request's cost outside the network, and the
network's cost per call at one row and at k rows, measured side by side in one process.

    python benchmarks/serve_ceiling.py --checkpoint runs/demo/elf-reg --rows 16 --requests 64

For ``--requests`` prompts of the toy test split (one request each, ``--sampler`` at ``--nfe``):

- outside the network: ``generate`` through an instant stand-in network of the same shapes (a
  denoise call returns its input, a decode call zeros), split into the prompt's encoding and the
  rest (canvas, the sampler's per-step updates, the text);
- the network: the calls the requests made, timed on the checkpoint's own network alone, one
  request's rows at a time and ``--rows`` requests' rows merged (medians over ``--repeats``).

From these, a request served alone costs outside + Σ t(1) over its calls, and k requests sharing
every call cost at best outside + Σ t(k)/k each, everything on the one thread ``elfreg serve``
makes it on. Their ratio is the most continuous batching can gain at k concurrent requests on this
machine, before HTTP and the clients' own work are counted (docs/serving.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import elfreg
from elfreg.device import use_bf16
from elfreg.runs import write_json_atomic
from elfreg.sampling import generate
from elfreg.sampling.network import StudentNetwork
from elfreg.toy import arith
from elfreg.toy.registry import as_example


class StandIn:
    """A network that answers at once with the right shapes and records each call's arguments."""

    def __init__(self, reg_dim: int | None, device: torch.device):
        self.reg_dim, self.device = reg_dim, device
        self.calls: list[tuple[str, tuple]] = []

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.calls.append(("denoise", (z, q, t, w, prompt_mask, reg, reg_q)))
        return z.clone(), None if reg is None else reg.clone()

    def decode(self, x, prompt_mask, reg, w):
        self.calls.append(("decode", (x, prompt_mask, reg, w)))
        return torch.zeros(prompt_mask.shape, dtype=torch.long, device=prompt_mask.device)


class TimedEncoder:
    """The frozen encoder with the time of its ``encode_canvas`` calls added up."""

    def __init__(self, encoder: Any):
        self._encoder, self.seconds = encoder, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._encoder, name)

    def encode_canvas(self, canvas: Any) -> torch.Tensor:
        began = time.perf_counter()
        out = self._encoder.encode_canvas(canvas)
        self.seconds += time.perf_counter() - began
        return out


def _median_seconds(fn: Any, repeats: int, device: torch.device) -> float:
    def finished() -> None:  # a device runs calls asynchronously: time them to their end
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up
    times = []
    for _ in range(repeats):
        finished()
        began = time.perf_counter()
        fn()
        finished()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _merged(args: list[tuple]) -> tuple:
    return tuple(None if parts[0] is None else torch.cat(parts) for parts in zip(*args, strict=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="runs/demo/elf-reg")
    p.add_argument("--requests", type=int, default=64, help="requests measured outside the network")
    p.add_argument("--rows", type=int, default=16, help="requests whose calls are merged (k)")
    p.add_argument("--nfe", type=int, default=16)
    p.add_argument("--sampler", default="early-stop")
    p.add_argument("--repeats", type=int, default=20, help="timings per network call (median)")
    p.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda, auto)")
    p.add_argument("--out", help="write the results (with the command line) as JSON here")
    args = p.parse_args(argv)
    if args.rows < 1 or args.requests < args.rows:
        p.error("--rows must be >= 1 and --requests at least --rows")

    models = elfreg.load(args.checkpoint, device=args.device).models
    device = next(models.student.parameters()).device
    sample = models.config.sample.replace(sampler=args.sampler, nfe=args.nfe)
    problems = arith.heldout("test", 1, arith.ArithConfig())
    prompts = [as_example(problems[k % len(problems)]).prompt for k in range(args.requests)]
    encoder = TimedEncoder(models.frozen.encoder)
    frozen = dataclasses.replace(models.frozen, encoder=encoder)
    stand_in = StandIn(models.student.teacher_dim if models.student.extra_token == "reg" else None, device)

    def one(k: int) -> list[tuple[str, tuple]]:
        before = len(stand_in.calls)
        generate(stand_in, [prompts[k]], sample, frozen_text=frozen, flow=models.config.flow, seed=k,
                 batch_size=32, progress=False)
        return stand_in.calls[before:]

    one(0)  # warm-up
    encoder.seconds, stand_in.calls = 0.0, []
    began = time.perf_counter()
    calls = [one(k) for k in range(args.requests)]
    outside = (time.perf_counter() - began) / args.requests
    encoding = encoder.seconds / args.requests

    net = StudentNetwork(models.student, use_bf16(device, models.precision),
                         eos_id=models.frozen.tokenizer.eos_token_id)
    kinds = [kind for kind, _ in calls[0]]
    if any([kind for kind, _ in c] != kinds for c in calls):
        raise SystemExit("the requests made different calls; pick a sampler without adaptive exit or trimming")
    alone = merged = 0.0
    for j, kind in enumerate(kinds):
        method = net.denoise if kind == "denoise" else net.decode
        solo, group = calls[0][j][1], _merged([calls[k][j][1] for k in range(args.rows)])
        alone += _median_seconds(lambda m=method, a=solo: m(*a), args.repeats, device)
        merged += _median_seconds(lambda m=method, a=group: m(*a), args.repeats, device) / args.rows
    result = {"command": sys.argv, "settings": vars(args), "calls_per_request": len(kinds),
              "outside_ms": 1e3 * outside, "encoding_ms": 1e3 * encoding,
              "network_alone_ms": 1e3 * alone, "network_shared_ms": 1e3 * merged,
              "alone_ms": 1e3 * (outside + alone), "shared_ms": 1e3 * (outside + merged),
              "bound": (outside + alone) / (outside + merged),
              "bound_network_only": alone / merged}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.out, result)
    print(f"per request: outside the network {result['outside_ms']:.1f} ms (prompt encoding "
          f"{result['encoding_ms']:.1f}); {len(kinds)} network calls: {result['network_alone_ms']:.1f} ms alone, "
          f"{result['network_shared_ms']:.1f} ms as 1/{args.rows} of merged calls")
    print(f"most continuous batching can gain at {args.rows} requests: {result['bound']:.2f}x "
          f"({result['bound_network_only']:.2f}x on the network alone)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
