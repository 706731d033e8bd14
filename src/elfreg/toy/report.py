"""Outputs of ``elfreg demo``: the printed table, ``results.json`` and the two figures."""

from __future__ import annotations

import os
from pathlib import Path

from elfreg.runs import write_json_atomic

LEVEL_NAMES = {1: "one-step", 2: "multi-step"}


def format_table(report: dict) -> str:
    b = report["baselines"]
    level = LEVEL_NAMES[report["config"]["data"]["toy_level"]]
    prec = report["precision"]
    device = prec.get("device", "cpu")
    rule = "fp32 on every CPU" if device == "cpu" else "bf16 on CUDA"
    why = f"forced by {prec['forced_by']}" if prec["forced_by"] else f"precision: auto, {rule}"
    lms = "" if device == "cpu" else f"; toy LMs built on the CPU in {prec['toy_lms']}"
    blocks = "compiled" if report["config"]["train"].get("compile") else "eager"
    lines = [f"precision: {prec['resolved']} on {device} ({why}{lms}; this CPU has native bf16: "
             f"{'yes' if prec['cpu_native_bf16'] else 'no'}; student blocks trained {blocks}); "
             "pass@1 ± sample std over sampling seeds",
             f"held-out {level} problems of the {report['config']['eval']['split']} split "
             f"(unseen number combinations): {report['n_test_problems']}",
             f"most frequent answer ({b['most_frequent_answer']['answer']}): "
             f"{100 * b['most_frequent_answer']['pass@1']:.1f}%",
             f"teacher LM greedy: {100 * b['teacher_greedy']['pass@1']:.1f}%   "
             f"encoder LM greedy: {100 * b['encoder_lm_greedy']['pass@1']:.1f}%"]
    lines += readout_lines(report)
    lines.append("")
    for variant, m in report["models"].items():
        u = m["untrained"]
        best = max(m["results"], key=lambda r: r["token_match"])
        lines.append(f"{variant} (trained {m['train_seconds']:.0f} s; untrained at 16 NFE: {100 * u['mean']:.1f}%, "
                     f"token match {100 * u['token_match']:.0f}% vs trained {100 * best['token_match']:.0f}%)")
        nfes = list(dict.fromkeys(r["nfe"] for r in m["results"]))
        cell = {(r["sampler"], r["nfe"]): f"{100 * r['mean']:6.1f} ± {100 * r['std']:4.1f}" for r in m["results"]}
        lines.append(f"  {'sampler':<11} " + " ".join(f"{'NFE ' + str(n):>14}" for n in nfes))
        for sampler in dict.fromkeys(r["sampler"] for r in m["results"]):
            lines.append(f"  {sampler:<11} " + " ".join(f"{cell.get((sampler, n), '-'):>14}" for n in nfes))
        if "seen" in m:
            seen = m["seen"]
            lines.append(f"  seen combinations (training problems, {seen['sampler']} {seen['nfe']} NFE, seed 0): "
                         f"{100 * seen['mean']:.1f}%")
        last = m["results"][-1]
        if last.get("errors"):
            kinds = ", ".join(f"{kind} {100 * share:.0f}%" for kind, share in last["errors"].items())
            lines.append(f"  wrong answers at {last['sampler']} {last['nfe']} NFE: {kinds}")
        if m["accuracy_curve"]:
            points = ", ".join(f"{p['step']}: {100 * p['pass@1']:.0f}%" for p in m["accuracy_curve"])
            lines.append(f"  learning curve (step: pass@1, early-stop 16 NFE, seed 0): {points}")
    return "\n".join(lines)


READOUT_FLOOR = 0.40
"""Digit readout of the student's encoder layer under which students have failed (33 % held-out
pass@1 on a build reading 36 %, 70-96 % on builds reading 48-89 %; docs/toy-tasks.md)."""


def readout_lines(report: dict) -> list[str]:
    """The toy encoder's digit readout at the layer the student reads (:mod:`elfreg.toy.readout`,
    from the toy-asset build report), with a warning under :data:`READOUT_FLOOR`."""
    layer = report["config"]["text"]["encoder_layer"]
    readout = report["asset_report"]["encoder"]["digit_readout"][str(layer)]  # JSON keys are strings
    lines = [f"encoder digit readout at layer {layer}: {100 * readout:.1f}%"]
    if readout < READOUT_FLOOR:
        lines.append(f"warning: under {100 * READOUT_FLOOR:.0f}%, this encoder build names digits too vaguely; "
                     "students trained on such builds have failed (docs/toy-tasks.md)")
    return lines


def write_outputs(out_dir: Path, report: dict) -> list[Path]:
    """Write ``results.json``, ``table.txt`` and the figures; return the paths written."""
    paths = [out_dir / "results.json", out_dir / "table.txt", out_dir / "pass1_vs_nfe.png"]
    write_json_atomic(paths[0], report)  # whole or not at all: a later --seeds run reuses it
    paths[1].write_text(format_table(report) + "\n")
    plot_pass1_vs_nfe(report, paths[2])
    if any(m["accuracy_curve"] for m in report["models"].values()):
        paths.append(out_dir / "learning_curve.png")
        plot_learning_curves(report, paths[-1])
    return paths


def _pyplot():
    from elfreg.paths import cache_dir

    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))  # keep its font cache ours
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, ax, report: dict, xlabel: str, path: Path) -> None:
    """Baselines, labels and legend shared by both figures; save and close."""
    b = report["baselines"]
    ax.axhline(100 * b["teacher_greedy"]["pass@1"], color="gray", ls=":", label="teacher LM greedy")
    ax.axhline(100 * b["most_frequent_answer"]["pass@1"], color="k", ls=":", lw=0.8, label="most frequent answer")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"pass@1 (%), held-out {LEVEL_NAMES[report['config']['data']['toy_level']]}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_pass1_vs_nfe(report: dict, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for k, (variant, m) in enumerate(report["models"].items()):
        for n, sampler in enumerate(dict.fromkeys(r["sampler"] for r in m["results"])):
            style = ("-o", "--s", ":^", "-.d")[n % 4]
            rows = [r for r in m["results"] if r["sampler"] == sampler]
            ax.errorbar([r["nfe"] for r in rows], [100 * r["mean"] for r in rows],
                        yerr=[100 * r["std"] for r in rows], fmt=style, color=f"C{k}", capsize=3,
                        label=f"{variant} {sampler}")
    ax.set_xscale("log", base=2)
    nfes = sorted({r["nfe"] for m in report["models"].values() for r in m["results"]})
    ax.set_xticks(nfes, [str(n) for n in nfes])
    _finish(plt, fig, ax, report, "NFE", path)


def plot_learning_curves(report: dict, path: Path) -> None:
    """Held-out pass@1 (early-stop, 16 NFE, sampling seed 0) against training step, per model."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for variant, m in report["models"].items():
        curve = m["accuracy_curve"]
        ax.plot([p["step"] for p in curve], [100 * p["pass@1"] for p in curve], "-o", ms=3, label=variant)
    _finish(plt, fig, ax, report, "training step", path)


def plot_seed_curves(curves: dict[str, dict[int, dict]], path: Path) -> list[str]:
    """The learning curves of several training seeds together (``curves[model][seed]`` as
    :func:`elfreg.toy.seeds.seed_curves` gives): one panel per loss term against step (log
    scale), and held-out pass@1 against step when any run measured it; colour is the seed, line
    style the model. Returns the panels' titles."""
    plt = _pyplot()
    first = next(iter(next(iter(curves.values())).values()))
    losses = [k for k in first if k not in ("step", "accuracy")]
    with_accuracy = any(c["accuracy"] for runs in curves.values() for c in runs.values())
    panels = len(losses) + with_accuracy
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    for m, (variant, runs) in enumerate(curves.items()):
        style = ("-", "--", ":", "-.")[m % 4]
        for k, (seed, c) in enumerate(runs.items()):
            label = f"{variant} seed {seed}" if len(curves) > 1 else f"seed {seed}"
            for ax, loss in zip(axes[0][:len(losses)], losses, strict=True):
                ax.plot(c["step"], c[loss], style, color=f"C{k}", lw=1, label=label)
            if with_accuracy and c["accuracy"]:
                axes[0][-1].plot([step for step, _ in c["accuracy"]], [100 * v for _, v in c["accuracy"]],
                                 style + "o", color=f"C{k}", ms=3, label=label)
    for ax, loss in zip(axes[0][:len(losses)], losses, strict=True):
        ax.set_yscale("log")
        ax.set_title(f"{loss} loss", fontsize=9)
        ax.set_xlabel("training step")
    if with_accuracy:
        axes[0][-1].set_title("held-out pass@1 (%), early-stop 16 NFE", fontsize=9)
        axes[0][-1].set_xlabel("training step")
        axes[0][-1].set_ylim(0, 100)
    axes[0][0].legend(fontsize=7)
    titles = [ax.get_title() for ax in axes[0]]
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return titles
