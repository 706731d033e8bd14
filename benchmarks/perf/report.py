"""The Markdown tables of a benchmark result (the JSON ``benchmarks/run.py`` writes)."""

from __future__ import annotations

from typing import Any


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def _gb(b: float) -> str:
    return f"{b / 2**30:.2f}"


def _share_floor(group: dict[str, float]) -> str:
    floor = f" ({group['over_floor']:.1f}× floor)" if "over_floor" in group else ""
    return f"{group['share']:.0%}{floor}"


def _breakdown_table(per_call: list[dict[str, Any]]) -> list[str]:
    """Op time of one profiled call per row, by group (``perf/breakdown.py``)."""
    lines = ["", "Where a call's op time goes (one profiled call; share of the time spent in aten ops, and that "
             "group's time over its own FLOP floor):", "",
             "| shape | call | batch | matmul | attention | other ops | outside ops ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for pc in per_call:
        for row in pc["calls"].values():
            bd = row.get("breakdown")
            if bd:
                outside = _ms(bd["unattributed_seconds"]) if "unattributed_seconds" in bd else "–"
                lines.append(f"| {pc['shape']} | {row['kind']} | {row['batch']} | {_share_floor(bd['matmul'])} | "
                             f"{_share_floor(bd['attention'])} | {bd['other']['share']:.0%} | {outside} |")
    return lines


def _host_memory_table(sections: list[dict[str, Any]]) -> list[str]:
    """The ELF-REG training step with malloc's default against ``train.host_memory: keep``."""
    lines = ["## Host memory: the ELF-REG training step, malloc's default (`release`) against `keep`", "",
             "(one process per setting and round, rounds alternating; medians over rounds)", "",
             "| shape | precision | setting | step ms | fwd ms | bwd ms | page faults / step | system s / step "
             "| peak RSS GiB |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for sec in sections:
        for setting in ("release", "keep"):
            row = sec[setting]
            ph = row["phase_seconds"]
            lines.append(f"| {sec['shape']} | {sec['precision']} | {setting} | {_ms(row['step_seconds'])} | "
                         f"{_ms(ph['forward'])} | {_ms(ph['backward'])} | {row['page_faults_per_step']:.0f} | "
                         f"{row['system_seconds_per_step']:.3f} | {_gb(row['peak_rss_bytes'])} |")
    lines += ["", "Step time release / keep: " + ", ".join(
        f"{sec['shape']} **{sec['release_over_keep']:.2f}×** ({sec['rounds']} rounds × {sec['steps']} steps)"
        for sec in sections) + ".", ""]
    return lines


def markdown(r: dict[str, Any]) -> str:
    """Machine, GEMM ceilings, training steps, network calls, end-to-end sampling and memory."""
    m = r["machine"]
    flags = ", ".join(f for f, on in m["cpu"]["flags"].items() if on) or "none"
    kind = "quick" if r["quick"] else "full" if r.get("full") else "default"
    lines = [f"# elfreg benchmark ({kind}, {r['precision']})", "",
             f"`{r['command']}`", "",
             f"Machine: {m['cpu']['model']} ({m['cpu']['logical_cpus']} logical CPUs; {flags}), "
             f"torch {m['torch']}, {m['threads']} threads, device {m['device']}"
             + (f" ({m['gpu']})" if "gpu" in m else "") + f"; total {r['seconds']:.0f} s.", "",
             "## GEMM ceilings (median GFLOP/s of n×n×n matmul)", "", "| precision | n | ms | GFLOP/s |",
             "|---|---:|---:|---:|"]
    for name, row in r["gemm"]["cases"].items():
        prec, n = name.split("_")
        lines.append(f"| {prec} | {n} | {_ms(row['seconds'])} | {row['gflops']:.1f} |")
    ceil = r["gemm"]["ceiling_gflops"]
    lines += ["", "Ceiling: " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in ceil.items()), ""]
    for sec in r.get("train", []):
        sh = sec["shape"]
        lines += [f"## Training step: {sh['name']} (width {sh['width']} × {sh['depth']}, batch {sh['batch']} × "
                  f"canvas {sh['canvas']}, vocab {sh['vocab']}, {sec['precision']}; median of {sec['repeats']})", "",
                  "| model | params | fwd ms | bwd ms | optim ms | step ms | GFLOP fwd+bwd | GFLOP/s fwd+bwd "
                  "| of ceiling | step of ceiling | optim share |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name in ("elf_reg", "elf"):
            c, s = sec[name], sec[name]["seconds"]
            lines.append(f"| {name} | {c['parameters'] / 1e6:.1f}M | {_ms(s['forward'])} | {_ms(s['backward'])} | "
                         f"{_ms(s['optimizer'])} | {_ms(s['step'])} | "
                         f"{(c['flops']['forward'] + c['flops']['backward']) / 1e9:.2f} | {c['fwd_bwd_gflops']:.1f} | "
                         f"{c['fraction_of_ceiling']:.1%} | {c['step_fraction_of_ceiling']:.1%} | "
                         f"{c['optimizer_share']:.1%} |")
        lines += ["", f"Ceiling measured in the same rounds (GEMM n={sec['probe']['n']}): "
                  f"{sec['probe']['gflops']:.1f} GFLOP/s; of the GEMM section's ceiling instead: "
                  + ", ".join(f"{n} {sec[n]['fraction_of_run_ceiling']:.1%}" for n in ("elf_reg", "elf")) + "."]
        me = sec["modelled_end_to_end"]
        lines += ["", f"ELF-REG / ELF step time, student only (measured): **{sec['elf_reg_over_elf']:.3f}**; "
                  f"with the frozen forwards (modelled FLOPs, `elfreg.train.cost`): **{me['elf_reg_over_elf']:.3f}** "
                  f"(frozen models {me['frozen_share_elf_reg']:.0%} of ELF-REG's FLOPs).", ""]
        e2e = sec.get("end_to_end")
        if e2e:
            lines += [f"End to end, measured in the same rounds (random bf16 frozen models of the run's shapes, "
                      f"read every step, no feature cache): encoder read {_ms(e2e['encoder_read'])} ms, teacher "
                      f"read {_ms(e2e['teacher_read'])} ms; ELF step {_ms(e2e['elf_step'])} ms, ELF-REG step "
                      f"{_ms(e2e['elf_reg_step'])} ms: ELF-REG / ELF **{e2e['elf_reg_over_elf']:.3f}** (frozen "
                      f"reads {e2e['frozen_share_elf_reg']:.0%} of the ELF-REG step).", ""]
        oi = sec.get("optimizer_impls")
        if oi:
            lines += ["Optimiser step (clip + update) by implementation, same gradients, interleaved: "
                      + ", ".join(f"{k} {_ms(v)} ms ({oi['speedup'][k]:.2f}× for-loop)"
                                  for k, v in oi["seconds"].items())
                      + ".", ""]
    if r.get("host_memory"):
        lines += _host_memory_table(r["host_memory"])
    samp = r.get("sampling", {})
    if "per_call" in samp:
        lines += ["## Network calls (time vs FLOP floor = FLOPs / ceiling)", "",
                  "| shape | call | batch | ms | GFLOP | floor ms | × floor | / denoise |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for pc in samp["per_call"]:
            lines.append(f"| {pc['shape']} | GEMM probe n={pc['probe']['n']} | | | | | "
                         f"{pc['probe']['gflops']:.1f} GFLOP/s | |")
            for row in pc["calls"].values():
                extra = f"{row['over_denoise']:.2f}" if "over_denoise" in row else ""
                lines.append(f"| {pc['shape']} | {row['kind']} | {row['batch']} | {_ms(row['seconds'])} | "
                             f"{row['flops'] / 1e9:.3f} | {_ms(row['floor_seconds'])} | {row['over_floor']:.1f} | "
                             f"{extra} |")
        lines += _breakdown_table(samp["per_call"])
        lines += ["", "Top token of a decode call's logits, `argmax` against `max(dim).indices` (the decode's "
                  "`top_token`), interleaved: " + "; ".join(
                      f"{t['shape']} batch {t['batch']} ({t['dtype']}) {_ms(t['seconds']['argmax'])} vs "
                      f"{_ms(t['seconds']['max'])} ms ({t['speedup']:.1f}×)" for t in samp.get("top_token", [])) + ".",
                  ""]
    if "end_to_end" in samp:
        for e2e in samp["end_to_end"]:
            lines += ["", f"## End-to-end sampling, {e2e['shape']} shape ({e2e['new_tokens']} answer positions; "
                      f"AR: same-size Qwen3, KV cache, greedy; median of {e2e['repeats']})", "",
                      "| model | sampler | NFE / steps | batch | ms per batch | ms per sample | vs AR |",
                      "|---|---|---:|---:|---:|---:|---:|"]
            for row in sorted(e2e["rows"].values(), key=lambda x: (x["batch"], x["model"] != "ar-kv-cache")):
                vs = "1"
                if "over_ar" in row:
                    vs = f"{row['over_ar']:.2f}× ({'AR wins' if row['over_ar'] > 1 else 'ELF wins'})"
                lines.append(f"| {row['model']} | {row['sampler']} | {row['nfe']} | {row['batch']} | "
                             f"{_ms(row['seconds'])} | {_ms(row['seconds'] / row['batch'])} | {vs} |")
            lines.append("")
    lines += ["## Peak memory (after each section; RSS is the process's running maximum)", "",
              "| after | peak RSS GiB | CUDA max allocated GiB |", "|---|---:|---:|"]
    for name, mem in r["memory"].items():
        cuda = _gb(mem["cuda_max_allocated_bytes"]) if "cuda_max_allocated_bytes" in mem else "–"
        lines.append(f"| {name} | {_gb(mem['peak_rss_bytes'])} | {cuda} |")
    return "\n".join(lines) + "\n"
