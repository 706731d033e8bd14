"""One benchmark run of elfreg on whatever device it finds: GEMM ceilings, the student's training
step, network calls and end-to-end sampling, peak memory; JSON plus a Markdown table.

    python benchmarks/run.py --out bench-out                 # the default run (demo + ELF-REG-B shapes)
    python benchmarks/run.py --quick --out /tmp/bench        # tiny shapes, 1 repeat (CI smoke test)
    python benchmarks/run.py --full --out bench-out          # + B calls at batch 32, B end to end at batch 16
    python benchmarks/run.py --precision bf16 --sections gemm train
    python benchmarks/run.py --precision bf16 --sections calls      # network calls and their op breakdown

Every ratio is taken between cases timed interleaved in this run (see ``perf/common.py``);
numbers from different runs or machines are not compared. ``docs/performance.md`` explains each
number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from elfreg.config import MODEL_SIZES
from elfreg.device import resolve_device, resolve_precision
from elfreg.host_memory import keep_freed_memory

from perf.common import machine_description, peak_memory_bytes
from perf.frozen import frozen_cases, frozen_shapes
from perf.gemm import gemm_ceilings
from perf.host_memory import host_memory_section
from perf.report import markdown
from perf.sample import end_to_end, per_call, top_token_ops
from perf.train import Shape, optimizer_section, train_section

SECTIONS = ("gemm", "train", "host", "calls", "e2e", "sampling")  # sampling: calls and e2e

# the toy demo (src/elfreg/toy/demo.py): 128 × 4 student, toy encoder 128 wide, teacher 192 wide, the
# toy LMs' vocabulary of 832 (the student's vocabulary head is the encoder's)
DEMO = Shape("demo", width=128, depth=4, heads=2, repa_block=2, projector_hidden=256, enc_dim=128,
             teacher_dim=192, vocab=832, batch=32, canvas=56, prompt=16, time_freq_dim=64)
# ELF-REG-B (configs/elf-reg-b-gsm8k.yaml) at batch 4 × canvas 256 (CPU-sized)
B = Shape("elf-reg-b", **MODEL_SIZES["elf-b"], projector_hidden=2048, enc_dim=1024, teacher_dim=2048, vocab=151_936,
          batch=4, canvas=256, prompt=64)
TINY = Shape("tiny", width=32, depth=2, heads=2, repa_block=1, projector_hidden=32, enc_dim=32,
             teacher_dim=48, vocab=64, batch=4, canvas=24, prompt=8, time_freq_dim=16)
TINY_WIDE = Shape("tiny-wide", width=64, depth=2, heads=2, repa_block=1, projector_hidden=64, enc_dim=48,
                  teacher_dim=64, vocab=512, batch=2, canvas=32, prompt=8, time_freq_dim=16)
# the shapes the A/B scripts take by name (--shape)
SHAPES = {s.name: s for s in (TINY, DEMO, B)}


def add_call_arguments(p: argparse.ArgumentParser, batches: list[int]) -> None:
    """``--shape``, ``--precision`` and ``--batches``: what the A/B scripts of sampling calls
    (attention_ab, cache_chunks_ab, sampling_host_memory_ab) build and time."""
    p.add_argument("--shape", choices=sorted(SHAPES), default=B.name,
                   help="network shape (default elf-reg-b; tiny is the smoke test's)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--batches", type=int, nargs="+", default=batches)


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    """``--repeats`` and ``--probe-n`` of the scripts that time calls beside a GEMM probe
    (:func:`perf.gemm.timed_beside_probe`)."""
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--probe-n", type=int, default=2048,
                   help="size n of the n×n×n GEMM probe timed beside the calls (the smoke test's is small: a 2048 "
                        "bf16 GEMM takes minutes where bf16 is emulated)")


def plan(quick: bool, full: bool = False) -> dict[str, Any]:
    """Shapes, sizes and repeats of a run. ``full`` adds the B shape's slowest cases on a CPU:
    network calls at batch 32 and end-to-end sampling at batch 16 (about half an hour more on 2
    cores)."""
    if quick:
        return {"repeats": 1, "gemm_sizes": [128, 256], "train_shapes": [(TINY, 0), (TINY_WIDE, 0)],
                "call_shapes": [(TINY, [1, 4]), (TINY_WIDE, [1])], "e2e": [(TINY, [1, 2], 1)],
                "nfes": [4, 8], "host": ([TINY], 1, 1)}
    # (shape, fewest repeats): the demo step takes 0.15-0.2 s, and a median of 3 of them moved
    # ELF-REG / ELF by 0.15 from run to run (1.247 in run 11, 1.07-1.10 over 21 rounds)
    return {"repeats": 3, "gemm_sizes": [1024, 2048], "train_shapes": [(DEMO, 15), (B, 0)],
            "host": ([DEMO, B], 3, 3),  # shapes, rounds (a process per setting each), timed steps
            "call_shapes": [(DEMO, [1, 8, 32]), (B, [1, 8, 32] if full else [1, 8])],
            # (shape, batches, repeats or 0 for the run's): the B shape end to end takes minutes a round
            "e2e": [(DEMO, [1, 16], 0), (B, [1, 16] if full else [1], 1)],
            "nfes": [16, 64, 128]}  # 64 and 128: the paper's main settings


def modelled_end_to_end(shape: Shape) -> dict[str, float]:
    """ELF-REG/ELF of the modelled FLOPs per canvas position *with* the frozen forwards
    (:func:`elfreg.train.cost.flops_per_token`): encoder for both, teacher for ELF-REG."""
    from elfreg.train.cost import flops_per_token

    enc, tea, _ = frozen_shapes(shape)
    reg = flops_per_token(shape.config(True), enc, tea)
    elf = flops_per_token(shape.config(False), enc, None)
    return {"elf_reg_flops_per_position": reg["total"], "elf_flops_per_position": elf["total"],
            "elf_reg_over_elf": reg["total"] / elf["total"],
            "frozen_share_elf_reg": (reg["frozen_encoder"] + reg["frozen_teacher"]) / reg["total"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes, 1 repeat (under a minute)")
    p.add_argument("--full", action="store_true",
                   help="also the B shape's network calls at batch 32 and end-to-end sampling at batch 16")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                   help="precision of the training and sampling sections (bf16: autocast); GEMM measures both")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="bench-out", help="folder for results.json and results.md")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
                   help="calls: network calls; e2e: end-to-end sampling against AR; sampling: both")
    p.add_argument("--repeats", type=int, default=0, help="timed repeats per case (0: the plan's)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    precision = resolve_precision(device, args.precision)
    if args.quick and args.full:
        p.error("--quick and --full are opposite plans; give one")
    cfg = plan(args.quick, args.full)
    repeats = args.repeats or cfg["repeats"]
    started = time.perf_counter()
    result: dict[str, Any] = {"command": " ".join(["benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])]),
                              "machine": machine_description(device), "precision": precision, "quick": args.quick,
                              "full": args.full, "memory": {}}
    # the ceilings are needed by every other section
    result["gemm"] = gemm_ceilings(cfg["gemm_sizes"], ["fp32", "bf16"], repeats, device)
    result["memory"]["gemm"] = peak_memory_bytes(device)
    ceiling = result["gemm"]["ceiling_gflops"][precision]
    sections = set(args.sections) | ({"calls", "e2e"} if "sampling" in args.sections else set())
    compiled = not args.quick  # compiling takes minutes; the smoke run leaves it out
    if sections & {"calls", "e2e", "train"}:
        # as elfreg's training and sampling commands do by default (train.host_memory, --host-memory:
        # keep); runs 1-8 timed their network calls with malloc as it was, training kept
        result["host_memory_kept"] = keep_freed_memory()
    if sections & {"calls", "e2e"}:
        result["sampling"] = {}
    if "calls" in sections:
        probe_n = max(cfg["gemm_sizes"])
        result["sampling"]["per_call"] = [per_call(s, bs, precision, ceiling, repeats, device, probe_n, compiled)
                                          for s, bs in cfg["call_shapes"]]
        result["sampling"]["top_token"] = [top_token_ops(s, max(bs), precision, repeats, device)
                                           for s, bs in cfg["call_shapes"]]
    if "e2e" in sections:
        result["sampling"]["end_to_end"] = [end_to_end(s, bs, cfg["nfes"], precision, n or repeats, device,
                                                       compiled and s is not B)  # compiling B: minutes
                                            for s, bs, n in cfg["e2e"]]
    if "sampling" in result:
        result["memory"]["sampling"] = peak_memory_bytes(device)
    if "host" in sections and device.type == "cpu":
        shapes, rounds, steps = cfg["host"]
        result["host_memory"] = [host_memory_section(s, precision, rounds, steps) for s in shapes]
    if "train" in sections:
        result["train"] = []
        for shape, fewest in cfg["train_shapes"]:
            n = max(fewest, repeats)
            section = train_section(shape, precision, ceiling, n, device, max(cfg["gemm_sizes"]),
                                    frozen_cases(shape, precision, device))
            section["modelled_end_to_end"] = modelled_end_to_end(shape)
            section["optimizer_impls"] = optimizer_section(shape, n, device)
            result["train"].append(section)
            result["memory"][f"train_{shape.name}"] = peak_memory_bytes(device)
    if "gemm" not in sections:
        result["gemm"]["note"] = "measured anyway: the other sections divide by its ceiling"
    result["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
