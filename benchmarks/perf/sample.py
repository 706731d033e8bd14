"""Sampling: the time of one network call against its FLOP floor, and end-to-end latency of the
samplers against an autoregressive model of the same size with a KV cache.

Network calls go through :class:`elfreg.sampling.network.StudentNetwork` (the object the samplers
call): a *denoise call* is one ``denoise`` (one student forward in denoise mode), a *decode call*
one ``decode`` (one student forward in decode mode, the vocabulary head on every answer position
and an argmax; no EOS early stop, so the work is fixed). A *decode, head on n* call is the work the
EOS stop leaves when every answer ends within its first n positions: the same forward, the head on
n positions per row (a random student never emits EOS, so the stop itself cannot be timed on one).
A *denoise, canvas n* call is a denoise call on the first n canvas positions: what a sample
trimmed by canvas trimming (``sample.trim``) pays per step once its answer has settled.
The *FLOP floor* of a call is its FLOPs (:func:`perf.flops.count`: matmuls and attention) divided
by the same run's GEMM ceiling: the time the call would take if every FLOP ran at the speed of a
large square matmul. In bf16, a third call per batch, *denoise, autocast casts*, runs the fp32
student under autocast as the network did before it kept a bf16 copy of its weights
(:mod:`elfreg.model.inference`): its time over the denoise call's is what the copy saves. Where
the network runs a batch's blocks in cache-sized chunks of samples
(:mod:`elfreg.sampling.cache_chunks`), *denoise, one chunk* runs the same call on the whole batch
at once: its time over the denoise call's is what the chunks save.

End to end, prompt states are random (the frozen encoder is not timed, as it is not an NFE);
the autoregressive baseline is a randomly initialised ``transformers`` ``Qwen3ForCausalLM`` with
the student's width, depth, heads, MLP width and vocabulary, ``generate`` greedy with
``use_cache=True`` and exactly as many new tokens as the answer region has positions.
"""

from __future__ import annotations

from typing import Any

import torch

from elfreg.config import FlowConfig, SampleConfig
from elfreg.model.presets import student_from_config
from elfreg.sampling import StudentNetwork, run_sampler
from elfreg.sampling.network import EOS_WINDOW, top_token

from .breakdown import time_breakdown
from .common import autocast_for, interleaved
from .flops import count
from .gemm import timed_beside_probe
from .train import Shape


def student_network(shape: Shape, precision: str, device: torch.device, compile: bool = False) -> StudentNetwork:
    torch.manual_seed(0)
    cfg = shape.config(reg=True)
    student = student_from_config(cfg, shape.enc_dim, shape.vocab, shape.teacher_dim).to(device)
    # a random student's x̂ head starts at zero; give it weights so calls see ordinary numbers
    torch.nn.init.normal_(student.final_layer.linear.weight, std=0.02)
    torch.nn.init.normal_(student.reg_head.linear.weight, std=0.02)
    return StudentNetwork(student, bf16=precision == "bf16", eos_id=None, compile=compile)


def call_inputs(shape: Shape, batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    prompt_mask = (torch.arange(shape.canvas) < shape.prompt)[None, :].expand(batch, -1).contiguous()
    return {"z": torch.randn(batch, shape.canvas, shape.enc_dim, generator=g).to(device),
            "prompt_mask": prompt_mask.to(device),
            "reg": torch.randn(batch, shape.teacher_dim, generator=g).to(device),
            "t": torch.full((batch,), 0.5, device=device), "w": torch.ones(batch, device=device)}


def _head_positions(shape: Shape) -> list[int]:
    """Answer positions the decode rows with an early EOS run the head on: one EOS window
    (``EOS_WINDOW``) and half the answer region, where shorter than the region."""
    answer = shape.canvas - shape.prompt
    return sorted({n for n in (EOS_WINDOW, answer // 2) if 0 < n < answer})


def _trimmed_canvases(shape: Shape) -> list[int]:
    """The canvas a trimmed sample runs on when its answer fills half the answer region."""
    n = shape.prompt + (shape.canvas - shape.prompt) // 2
    return [n] if shape.prompt < n < shape.canvas else []


def per_call(shape: Shape, batches: list[int], precision: str, ceiling_gflops: float, repeats: int,
             device: torch.device, probe_n: int = 2048, compiled: bool = False) -> dict[str, Any]:
    """Seconds, FLOPs, floor and time/floor of a denoise and a decode call at each batch size,
    and decode/denoise; every call of every batch size and a GEMM probe (n = ``probe_n``) timed
    interleaved. The floor divides by the probe's GFLOP/s (same rounds, same load);
    ``over_run_floor`` divides by ``ceiling_gflops`` (the run's GEMM section) instead. With
    ``compiled``, a denoise call of the same network through ``torch.compile`` too (compiled in
    the untimed warm-up round). After the timed rounds, one more denoise and decode call of each
    batch runs under the profiler: ``breakdown`` (:func:`perf.breakdown.time_breakdown`)."""
    net = student_network(shape, precision, device)
    fast = student_network(shape, precision, device, compile=True) if compiled else None
    whole = StudentNetwork(net.student, bf16=net.bf16, eos_id=None, cache_chunks=False)
    cases, flops = {}, {}
    for b in batches:
        x = call_inputs(shape, b, device)
        q = torch.zeros_like(x["z"])

        def denoise(x=x, q=q):
            return net.denoise(x["z"], q, x["t"], x["w"], x["prompt_mask"], x["reg"], None)

        def decode(x=x):
            return net.decode(x["z"], x["prompt_mask"], x["reg"], x["w"])

        def denoise_autocast(x=x, q=q):
            # the network's call before it kept a bf16 weight copy: autocast casts every weight
            with torch.no_grad(), autocast_for(device, precision):
                return net.student(x["z"], q, x["t"], x["w"], x["prompt_mask"], reg=x["reg"])

        kinds = [("denoise", denoise), ("decode", decode)]
        for n in _head_positions(shape):
            # the work of a decode that stops at EOS when every answer ends within its first n
            # positions: the same forward, the head on n positions per row (the rest marked prompt)
            short = x["prompt_mask"] | (torch.arange(shape.canvas, device=device) >= shape.prompt + n)
            kinds.append((f"decode, head on {n}", lambda x=x, short=short: net.decode(x["z"], short, x["reg"], x["w"])))
        for n in _trimmed_canvases(shape):
            kinds.append((f"denoise, canvas {n}", lambda x=x, q=q, n=n: net.denoise(
                x["z"][:, :n], q[:, :n], x["t"], x["w"], x["prompt_mask"][:, :n], x["reg"], None)))
        if net.bf16:
            kinds.append(("denoise, autocast casts", denoise_autocast))
        if net.sample_chunks(x["z"]) is not None:
            kinds.append(("denoise, one chunk", lambda x=x, q=q: whole.denoise(x["z"], q, x["t"], x["w"],
                                                                              x["prompt_mask"], x["reg"], None)))
        if fast is not None:
            kinds.append(("denoise, compiled", lambda x=x, q=q: fast.denoise(x["z"], q, x["t"], x["w"],
                                                                            x["prompt_mask"], x["reg"], None)))
        for kind, fn in kinds:
            cases[(kind, b)] = fn
            # the compiled call does the denoise call's work; counting it would trace it under hooks
            flops[(kind, b)] = flops[("denoise", b)] if kind == "denoise, compiled" else count(fn)
    seconds, probe_gflops = timed_beside_probe({f"{k}_{b}": fn for (k, b), fn in cases.items()}, precision,
                                               repeats, device, probe_n)
    rows = {}
    for (kind, b) in cases:
        s, f = seconds[f"{kind}_{b}"], flops[(kind, b)]["total"]
        floor = f / (probe_gflops * 1e9)
        rows[f"{kind}_b{b}"] = {"kind": kind, "batch": b, "seconds": s, "flops": f, "floor_seconds": floor,
                                "over_floor": s / floor, "over_run_floor": s / (f / (ceiling_gflops * 1e9))}
        if kind in ("denoise", "decode"):
            rows[f"{kind}_b{b}"]["breakdown"] = time_breakdown(cases[(kind, b)], flops[(kind, b)], probe_gflops,
                                                                device)
    for kind, b in cases:
        if kind != "denoise":
            rows[f"{kind}_b{b}"]["over_denoise"] = rows[f"{kind}_b{b}"]["seconds"] / rows[f"denoise_b{b}"]["seconds"]
    return {"shape": shape.name, "precision": precision, "repeats": repeats,
            "probe": {"n": probe_n, "gflops": probe_gflops}, "calls": rows}


def top_token_ops(shape: Shape, batch: int, precision: str, repeats: int, device: torch.device) -> dict[str, Any]:
    """``argmax`` against ``max(dim).indices`` (what the decode call uses, :func:`top_token`) on
    random logits of one decode call's shape (answer positions × vocabulary), interleaved."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(batch * (shape.canvas - shape.prompt), shape.vocab, generator=g).to(device, dtype)
    seconds = interleaved({"argmax": lambda: logits.argmax(-1), "max": lambda: top_token(logits)}, repeats, device)
    return {"shape": shape.name, "batch": batch, "dtype": str(dtype).removeprefix("torch."), "seconds": seconds,
            "speedup": seconds["argmax"] / seconds["max"]}


def ar_model(shape: Shape, device: torch.device):
    """A random Qwen3 causal LM of the student's size (width, depth, heads, MLP width, vocab)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=shape.vocab, hidden_size=shape.width, intermediate_size=(8 * shape.width) // 3,
                      num_hidden_layers=shape.depth, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.heads, head_dim=shape.width // shape.heads,
                      max_position_embeddings=shape.canvas + 8, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).to(device).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def end_to_end(shape: Shape, batches: list[int], nfes: list[int], precision: str, repeats: int,
               device: torch.device, compiled: bool = False) -> dict[str, Any]:
    """Seconds per batch of early-stop and full-span sampling at each NFE and of AR generation
    of ``canvas − prompt`` tokens, at each batch size, all timed interleaved; each ELF row
    carries ``over_ar`` (its time / AR's: < 1 means ELF is faster). With ``compiled``, early-stop
    through a ``torch.compile``-d network too (model ``elf-reg, compiled``)."""
    net = student_network(shape, precision, device)
    nets = {"elf-reg": net}
    if compiled:
        nets["elf-reg, compiled"] = student_network(shape, precision, device, compile=True)
    ar = ar_model(shape, device)
    new_tokens = shape.canvas - shape.prompt
    flow = FlowConfig()
    cases, meta = {}, {}
    for b in batches:
        x = call_inputs(shape, b, device)
        seeds = list(range(b))
        runs = [("elf-reg", "early-stop"), ("elf-reg", "full-span")]
        runs += [(m, "early-stop") for m in nets if m != "elf-reg"]
        for model, sampler in runs:
            for n in nfes:
                cfg = SampleConfig(sampler=sampler, nfe=n, sc_cfg=1.0)
                name = f"{model}_{sampler}_nfe{n}_b{b}"
                cases[name] = (lambda x=x, cfg=cfg, seeds=seeds, net=nets[model]:
                               run_sampler(net, x["z"], x["prompt_mask"], seeds, cfg, flow))
                meta[name] = {"model": model, "sampler": sampler, "nfe": n, "batch": b}
        ids = torch.randint(1, shape.vocab, (b, shape.prompt), generator=torch.Generator().manual_seed(b)).to(device)

        def generate(ids=ids):
            with torch.no_grad(), autocast_for(device, precision):
                return ar.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                   min_new_tokens=new_tokens, do_sample=False, use_cache=True)

        cases[f"ar_b{b}"] = generate
        meta[f"ar_b{b}"] = {"model": "ar-kv-cache", "sampler": "greedy", "nfe": new_tokens, "batch": b}
    # a sampler's calls have the same shapes at every NFE: warming up at the fewest is enough
    for name, fn in cases.items():
        if meta[name]["model"] == "ar-kv-cache" or meta[name]["nfe"] == min(nfes):
            fn()
    seconds = interleaved(cases, repeats, device, warmup=0)
    rows = {name: {**meta[name], "seconds": s} for name, s in seconds.items()}
    for row in rows.values():
        if row["model"] != "ar-kv-cache":
            row["over_ar"] = row["seconds"] / rows[f"ar_b{row['batch']}"]["seconds"]
    return {"shape": shape.name, "precision": precision, "repeats": repeats, "new_tokens": new_tokens,
            "rows": rows}
