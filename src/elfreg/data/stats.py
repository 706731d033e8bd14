"""``elfreg data stats``: the accounting of a prepared recipe as a table, beside the paper's
Table 8 figures when the recipe is one of the paper's (``data.paper``)."""

from __future__ import annotations

from typing import Any

__all__ = ["PAPER_TABLE_8", "stats_table"]

# Appendix B.2, Table 8: samples after filtering, training tokens (prompt + answer + EOS, no
# padding, over all epochs), epochs. MATH's tokens include the 4.185B of the GSM8K model it
# starts from (7.5 of GSM8K's 12 epochs).
PAPER_TABLE_8: dict[str, dict[str, Any]] = {
    "gsm8k": {"samples": 2_404_028, "tokens": 6.696e9, "epochs": 12, "init_tokens": 0.0},
    "math": {"samples": 3_572_583, "tokens": 17.810e9, "epochs": 8, "init_tokens": 4.185e9},
    "code": {"samples": 2_740_479, "tokens": 14.958e9, "epochs": 12, "init_tokens": 0.0},
    "mmlu": {"samples": 96_112, "tokens": 1.259e9, "epochs": 30, "init_tokens": 0.0},
}


def _n(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1e9:
        return f"{x / 1e9:.3f}B"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3f}M"
    return f"{x:,.0f}"


def stats_table(stats: dict[str, Any]) -> str:
    """The per-source table of ``stats.json`` and, for a paper recipe, the comparison."""
    head = ("source", "rows in", "filtered", "decontam.", "rows out", "epochs", "samples", "tokens", "cut")
    lines = [head]
    for s in stats["sources"]:
        lines.append((s["name"], _n(s["rows_in"]), _n(sum(s["filtered"].values())),
                      _n(sum(s["decontaminated"].values())), _n(s["rows_out"]), f"{s['epochs']:g}",
                      _n(s["samples"]), _n(s["tokens"]), _n(s["prompt_tokens_cut"] + s["answer_tokens_cut"])))
    t = stats["total"]
    lines.append(("total", _n(sum(s["rows_in"] for s in stats["sources"])), "", "", _n(stats["rows"]), "",
                  _n(t["samples"]), _n(t["tokens"]), _n(t["prompt_tokens_cut"] + t["answer_tokens_cut"])))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    out = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                 strict=True)))
           for row in lines]
    out.append(f"tokens are prompt + answer + EOS per sample, no padding; the canvas ({stats['canvas_len']} tokens, "
               f"prompt cap {stats['prompt_cap']}) cuts {_n(t['prompt_tokens_cut'])} prompt and "
               f"{_n(t['answer_tokens_cut'])} answer tokens; {_n(t['answers_truncated'])} answers lose their EOS")
    for filters in (s for s in stats["sources"] if s["filtered"]):
        out.append(f"{filters['name']}: " + "; ".join(f"{k}: {_n(v)} dropped" for k, v in filters["filtered"].items()))
    if "decontamination" in stats:
        d = stats["decontamination"]
        rules = ", ".join(f"{k} {v}" for k, v in d["by_rule"].items())
        out.append(f"decontamination against {', '.join(d['against'])} (8-gram Jaccard > {d['threshold']}): "
                   f"{_n(d['rows_dropped'])} rows dropped ({rules}) in {d['groups_dropped']} groups")
    paper = PAPER_TABLE_8.get(stats.get("paper") or "")
    if paper is not None:
        per_epoch = (paper["tokens"] - paper["init_tokens"]) / paper["epochs"]
        epochs = stats.get("train_epochs") or 0
        out += ["", f"paper Table 8 ({stats['paper']})    ours        paper",
                f"samples                 {_n(t['samples']):>10}  {_n(paper['samples']):>10}",
                f"tokens per epoch        {_n(t['tokens']):>10}  {_n(per_epoch):>10}",
                f"epochs                  {epochs or '-':>10}  {paper['epochs']:>10}",
                f"training tokens         {_n(stats.get('train_tokens')):>10}  {_n(paper['tokens']):>10}"
                + (f"  (incl. {_n(paper['init_tokens'])} of the GSM8K start)" if paper["init_tokens"] else "")]
    return "\n".join(out) + "\n"
