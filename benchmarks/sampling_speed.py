"""Wall time of the samplers on a randomly initialised student (no checkpoint, no encoder).

    python benchmarks/sampling_speed.py --preset tiny --canvas 256 --prompt-len 64 --batch 4 --nfe 16
    python benchmarks/sampling_speed.py --preset elf-reg-b --canvas 1024 --batch 16 --nfe 64 --device cuda

Prompt states are random standardised vectors; the frozen encoder (run once per batch, not
counted as NFE) is not included. Reports seconds per batch, per sample, per counted network call
and the NFE each sampler used.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from elfreg.config import SAMPLERS, SampleConfig
from elfreg.device import resolve_device, use_bf16
from elfreg.model.presets import PRESETS
from elfreg.model.student import Student
from elfreg.sampling import StudentNetwork, run_sampler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--enc-dim", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--teacher-dim", type=int, default=2048)
    p.add_argument("--canvas", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--nfe", type=int, default=16)
    p.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = resolve_device(args.device)
    bf16 = use_bf16(device, args.precision)
    model = dataclasses.replace(PRESETS[args.preset], repa=False)  # sampling never runs the projector
    torch.manual_seed(0)
    student = Student(model, args.enc_dim, args.vocab, args.teacher_dim if model.extra_token == "reg" else None)
    torch.nn.init.normal_(student.final_layer.linear.weight, std=0.02)
    net = StudentNetwork(student.to(device), bf16)
    states = torch.randn(args.batch, args.canvas, args.enc_dim, device=device)
    mask = (torch.arange(args.canvas, device=device) < args.prompt_len).expand(args.batch, -1).clone()
    seeds = list(range(args.batch))
    print(f"{args.preset} on {device} ({'bf16' if bf16 else 'fp32'}), canvas {args.canvas}, prompt {args.prompt_len}, "
          f"batch {args.batch}, N = {args.nfe}")
    run_sampler(net, states, mask, seeds, SampleConfig(nfe=2))  # warm-up
    for sampler in args.samplers:
        options = SampleConfig(sampler=sampler, nfe=args.nfe, adaptive_patience=2, adaptive_interval=4)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run_sampler(net, states, mask, seeds, options)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        calls = int(out.nfe.sum())
        print(f"{sampler:>11}: {wall:8.3f} s/batch  {wall / args.batch:8.3f} s/sample  "
              f"{1e3 * wall / max(calls, 1) * args.batch:8.2f} ms/batched call  NFE used {out.nfe.tolist()}")


if __name__ == "__main__":
    main()
