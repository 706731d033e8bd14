"""Table 11 / Fig. 2 / Table 13 from the scored rows of a trajectory analysis: the aggregate
(``table11.json``), the printed table and the figure (``fig2.png``).

Every rate is over (problem, seed) pairs; Prop. 1 and Prop. 2 rates are over (pair, t) points.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .measure import Plan
from .trajectory_metrics import paired_flips

#: Table 13 reads the uniform-grid diagnostics at t = 5/64
TABLE13_T = 5 / 64


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def per_nfe(rows: list[dict[str, Any]], plan: Plan, lipschitz: float | None) -> list[dict[str, Any]]:
    """One entry per reported NFE: means over pairs (Fig. 2 (b)–(e), Table 11)."""
    out = []
    for n in plan.reported:
        cells = [r["nfe"][str(n)] for r in rows]
        entry = {"nfe": n, "t": _mean([c["t"] for c in cells]),
                 "endpoint_error": _mean([c["endpoint_error"] for c in cells]),
                 "endpoint_error_norm": _mean([c["endpoint_error_norm"] for c in cells]),
                 "joint_error": _mean([c["joint_error"] for c in cells]),
                 "stable_tokens": _mean([c["stable"] for c in cells]),
                 "exact_agreement": _mean([float(c["exact"]) for c in cells]),
                 "answer_agreement": _mean([float(c["answer_agree"]) for c in cells]),
                 "pass@1": _mean([float(c["correct"]) for c in cells])}
        if lipschitz is not None and n < plan.master:
            holds = [prop2(r, n, lipschitz) for r in rows]
            entry["prop2_holds"] = _mean([float(h) for h in holds])
        out.append(entry)
    return out


def prop2(row: dict[str, Any], n: int, lipschitz: float) -> bool:
    """Prop. 2's L·‖e‖ < m for one pair at NFE ``n`` (head-space e and endpoint margin m)."""
    return lipschitz * row["prop2"]["error"][str(n)] < row["prop2"]["margin"]


def prop2_summary(rows: list[dict[str, Any]], plan: Plan, lipschitz: float) -> dict[str, Any]:
    points = [(r, n) for r in rows for n in plan.nfes if n < plan.master]
    holds = [prop2(r, n, lipschitz) for r, n in points]
    exact = [r["nfe"][str(n)]["exact"] for r, n in points]
    return {
        "lipschitz": lipschitz,
        "lipschitz_estimate": "sqrt(2) * spectral norm of vocab_head * 1.129 (GELU's largest slope) * spectral "
                              "norm of dec_proj: a Lipschitz constant of every pairwise logit difference as a "
                              "function of the head's input h, not of the whole decoder (its Transformer is not "
                              "bounded)",
        "error": "max over the endpoint's answer positions and first EOS of ||h_i(d_{N-2}) - h_i(d_{M-2})||, "
                 "h the decode-mode hidden state read by the head",
        "margin": "min over the same positions of the endpoint's winning logit minus its best competitor",
        "points": len(points), "holds": _mean([float(h) for h in holds]),
        "exact_agreement": _mean([float(e) for e in exact]),
        "holds_but_output_differs": sum(h and not e for h, e in zip(holds, exact, strict=True)),
        "median_margin": _median([r["prop2"]["margin"] for r in rows]),
    }


def acceleration_summary(rows: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """Fig. 2(a) and Prop. 1 along the uniform-grid trajectories (Table 13 at t = 5/64)."""
    k_points = plan.uniform
    times = [k / (k_points - 1) for k in range(k_points - 1)]  # t_0 … t_{K−2}
    by_t, holds_all = [], []
    for k, t in enumerate(times):
        errs = [r["acceleration"]["error"][k] for r in rows]
        caps = [r["acceleration"]["A"][k] for r in rows]
        bound = [a * (1 - t) ** 2 / 2 for a in caps]
        holds = [e <= b for e, b in zip(errs, bound, strict=True)]
        holds_all += holds
        entry = {"t": t, "median_error": _median(errs), "median_A": _median(caps), "median_bound": _median(bound),
                 "prop1_holds": _mean([float(h) for h in holds])}
        if k >= 1:
            entry["median_acceleration"] = _median([r["acceleration"]["a"][k - 1] for r in rows])
        by_t.append(entry)
    at = min(range(len(times)), key=lambda k: abs(times[k] - TABLE13_T))
    return {"grid_points": k_points, "prop1_points": len(holds_all),
            "prop1_holds": _mean([float(h) for h in holds_all]),
            "table13": {"t": times[at], "median_remaining_max_acceleration": by_t[at]["median_A"],
                        "median_joint_endpoint_error": by_t[at]["median_error"]},
            "by_t": by_t}


def summarize(rows: list[dict[str, Any]], plan: Plan, lipschitz: float | None, config: dict[str, Any]
              ) -> dict[str, Any]:
    """The content of ``table11.json``."""
    early = [bool(r["nfe"][str(plan.flip_nfe)]["correct"]) for r in rows]
    end = [bool(r["nfe"][str(plan.master)]["correct"]) for r in rows]
    flips = paired_flips(early, end)
    out: dict[str, Any] = {
        "config": config, "pairs": len(rows), "problems": len({r["task_id"] for r in rows}),
        "seeds": sorted({r["seed"] for r in rows}), "master": plan.master, "observations": list(plan.observe),
        "per_nfe": per_nfe(rows, plan, lipschitz),
        "flips": {"nfe": plan.flip_nfe, "endpoint_nfe": plan.master, **flips,
                  "pass@1_early": _mean([float(x) for x in early]), "pass@1_endpoint": _mean([float(x) for x in end]),
                  "net_change": (flips["wrong_to_right"] - flips["right_to_wrong"]) / max(1, flips["n"])},
    }
    if lipschitz is not None:
        out["prop2"] = prop2_summary(rows, plan, lipschitz)
    if plan.uniform:
        out["acceleration"] = acceleration_summary(rows, plan)
    return out


def _f(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(summary: dict[str, Any]) -> str:
    """The printed report: Table 11 per NFE, the flips, Prop. 2 and Prop. 1."""
    cfg = summary["config"]
    lines = [f"trajectory analysis: {cfg['task']['task']}, {summary['problems']} problems x "
             f"{len(summary['seeds'])} seeds = {summary['pairs']} pairs, master M = {summary['master']}",
             f"checkpoint: {cfg['checkpoint']}",
             f"{'NFE':>5} {'t_N-2':>7} {'endpt err':>9} {'stable':>7} {'exact':>7} {'answer':>7} {'pass@1':>7}"
             f" {'Prop.2':>7}"]
    for e in summary["per_nfe"]:
        lines.append(f"{e['nfe']:>5} {_f(e['t']):>7} {_f(e['endpoint_error']):>9} {_f(e['stable_tokens']):>7} "
                     f"{_f(e['exact_agreement']):>7} {_f(e['answer_agreement']):>7} {_f(e['pass@1']):>7} "
                     f"{_f(e.get('prop2_holds')):>7}")
    f = summary["flips"]
    lines.append(f"flips NFE {f['nfe']} -> {f['endpoint_nfe']}: wrong->right {f['wrong_to_right']}, right->wrong "
                 f"{f['right_to_wrong']} of {f['n']} (net {100 * f['net_change']:+.2f} points)")
    if "prop2" in summary:
        p = summary["prop2"]
        lines.append(f"Prop. 2 (decoder head, L = {p['lipschitz']:.4g}): L*||e|| < m at {100 * (p['holds'] or 0):.2f}% "
                     f"of {p['points']} (pair, NFE) points; holds but output differs: {p['holds_but_output_differs']}")
    if "acceleration" in summary:
        a = summary["acceleration"]
        t13 = a["table13"]
        lines.append(f"Prop. 1 (uniform grid, {a['grid_points']} points): ||e_t|| <= A(1-t)^2/2 at "
                     f"{100 * (a['prop1_holds'] or 0):.2f}% of {a['prop1_points']} (pair, t) points; at t = "
                     f"{t13['t']:.4f}: median A = {_f(t13['median_remaining_max_acceleration'], 1)}, median ||e|| = "
                     f"{_f(t13['median_joint_endpoint_error'], 3)}")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: str | Path) -> None:
    """Fig. 2: (a) joint acceleration vs t (when measured), (b)–(f) endpoint error, stable tokens,
    exact and answer agreement and pass@1 vs NFE; the dashed line marks the flip NFE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["per_nfe"]
    nfes = [e["nfe"] for e in rows]
    panels = [("endpoint_error", "(b) text endpoint error (relative)"), ("stable_tokens", "(c) stable tokens"),
              ("exact_agreement", "(d) exact agreement"), ("answer_agreement", "(e) answer agreement"),
              ("pass@1", "(f) pass@1")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    ax = axes[0][0]
    accel = summary.get("acceleration")
    if accel:
        pts = [(e["t"], e["median_acceleration"]) for e in accel["by_t"] if e.get("median_acceleration")]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
        ax.set_yscale("log")
        ax.set_xlabel("t (uniform grid)")
        ax.set_title("(a) joint acceleration ||a_t|| (median)")
    else:
        ax.text(0.5, 0.5, "acceleration not measured", ha="center", va="center")
        ax.set_axis_off()
    for ax, (key, title) in zip([a for line in axes for a in line][1:], panels, strict=True):
        ax.plot(nfes, [e[key] for e in rows], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xticks(nfes, [str(n) for n in nfes])
        ax.axvline(summary["flips"]["nfe"], linestyle="--", color="gray")
        ax.set_xlabel("NFE (readout of the master trajectory)")
        ax.set_title(title)
        if key != "endpoint_error":
            ax.set_ylim(-0.02, 1.02)
    fig.suptitle(f"{summary['config']['task']['task']}: master M = {summary['master']}, {summary['pairs']} pairs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
