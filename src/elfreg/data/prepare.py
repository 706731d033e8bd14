"""``elfreg data prepare``: a recipe's examples, decontaminated, tokenised once into shards
(:mod:`.shards`), with ``stats.json``.

Token accounting follows the paper (Appendix B.2): a sample's tokens are its prompt, its answer
and one EOS, never padding; a source's tokens count each of its samples (a row seen twice per
epoch counts twice). The canvas overflow policy (:func:`elfreg.text.canvas.fit_lengths`) is
applied to the same lengths to count what training cuts: prompt tokens beyond the cap, answer
tokens beyond the canvas and the EOS that then does not fit.

Memory stays bounded: rows stream from their sources (twice when decontaminating), are
tokenised in batches and written straight to disk; what is held per row is its source index.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config, DataConfig
from ..plugins import resolve_model_id
from ..text.canvas import fit_lengths, token_ids
from ..text.tokenizer import load_tokenizer
from .recipe import RecipeRow, SourceCounts, recipe_rows
from .shards import FORMAT, ShardedExamples, ShardWriter, read_manifest

__all__ = ["open_prepared", "prepare", "recipe_fingerprint", "token_stats"]

_BATCH = 512
_NOT_RECIPE = ("prepared", "shard_rows", "paper", "limit", "toy_seed")


def recipe_fingerprint(cfg: Config) -> dict[str, Any]:
    """What a prepared folder must have been made from to train ``cfg``: the data settings
    that change examples, and the tokenizer."""
    data = {k: v for k, v in dataclasses.asdict(cfg.data).items() if k not in _NOT_RECIPE}
    return {"data": data, "tokenizer": cfg.text.tokenizer or cfg.text.encoder,
            "tokenizer_revision": cfg.text.encoder_revision if cfg.text.tokenizer is None else None}


def open_prepared(cfg: Config) -> ShardedExamples:
    """The shards of ``cfg.data.prepared``, refused (naming the differing settings) when they
    were prepared from another recipe or tokenizer."""
    folder = cfg.data.prepared
    manifest = read_manifest(folder)
    want, got = recipe_fingerprint(cfg), manifest.get("recipe", {})
    if want != got:
        keys = sorted({k for k in want["data"] if want["data"].get(k) != got.get("data", {}).get(k)}
                      | {k for k in ("tokenizer", "tokenizer_revision") if want[k] != got.get(k)})
        raise ValueError(f"data.prepared: {folder} was prepared from a different recipe (differs in: "
                         f"{', '.join(keys)}); run `elfreg data prepare` again")
    return ShardedExamples(folder)


def mixture_samples(row_source: np.ndarray, epochs: list[float], seed: int = 0) -> np.ndarray:
    """One epoch of the mixture: each source's rows ⌊m⌋ times, plus a fixed (seeded) part of
    them for the fraction of its multiplier m."""
    rng = np.random.default_rng(seed)
    parts = []
    for s, m in enumerate(epochs):
        rows = np.flatnonzero(row_source == s)
        parts += [rows] * int(m)
        extra = round((m - int(m)) * len(rows))
        if extra:
            parts.append(np.sort(rng.permutation(rows)[:extra]))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def token_stats(prompt_len: np.ndarray, answer_len: np.ndarray, canvas_len: int, prompt_cap: int
                ) -> dict[str, int]:
    """Token accounting of samples with these lengths: tokens (prompt + answer + EOS, no
    padding), what the canvas keeps, and what its overflow policy cuts."""
    p, a = np.asarray(prompt_len, np.int64), np.asarray(answer_len, np.int64)
    kept_p, kept_a, eos = fit_lengths(p, a, canvas_len, prompt_cap)
    return {"samples": int(len(p)), "prompt_tokens": int(p.sum()), "answer_tokens": int(a.sum()),
            "eos_tokens": int(len(p)), "tokens": int(p.sum() + a.sum() + len(p)),
            "tokens_on_canvas": int(kept_p.sum() + kept_a.sum() + eos.sum()),
            "prompt_tokens_cut": int((p - kept_p).sum()), "answer_tokens_cut": int((a - kept_a).sum()),
            "eos_cut": int((~eos).sum()), "prompts_truncated": int((p > kept_p).sum()),
            "answers_truncated": int((~eos).sum())}


def _rows(data: DataConfig, passes: list[dict[str, SourceCounts]]):
    counts: dict[str, SourceCounts] = {}
    passes.append(counts)
    return recipe_rows(data, counts)


def prepare(cfg: Config, out: str | Path, data_dir: str | None = None) -> dict[str, Any]:
    """Prepare the recipe of ``cfg.data`` into ``out``; returns the statistics (also written
    to ``out/stats.json``)."""
    start = time.perf_counter()
    data, out = cfg.data, Path(out)
    if (out / "manifest.json").exists():
        raise FileExistsError(f"{out} already holds prepared data; choose a new folder or remove it")
    sources = data.resolved_sources()
    tokenizer = load_tokenizer(resolve_model_id(cfg.text.tokenizer or cfg.text.encoder),
                               cfg.text.encoder_revision if cfg.text.tokenizer is None else None)
    passes: list[dict[str, SourceCounts]] = []
    decon = None
    if data.decontaminate:
        from .decontaminate import Decontaminator, ReferenceIndex
        from .references import load_references

        decon = Decontaminator(ReferenceIndex(load_references(data.decontaminate, data_dir), data.jaccard_threshold))
        stream = decon.filter(lambda: _rows(data, passes), lambda r: (r[1].question, r[1].raw_answer, r[1].group))
    else:
        stream = ((item, None) for item in _rows(data, passes))
    dropped = [dict.fromkeys(("exact", "8gram", "ast", "group"), 0) for _ in sources]
    writer, row_source, batch = ShardWriter(out, data.shard_rows), [], []

    def flush(batch: list[tuple[int, RecipeRow]]) -> None:
        prompts = token_ids(tokenizer, [r.prompt for _, r in batch])
        answers = token_ids(tokenizer, [r.answer for _, r in batch])
        for (s, row), p, a in zip(batch, prompts, answers, strict=True):
            if not p:
                raise ValueError(f"{row.where}: empty prompt after tokenisation")
            writer.add(p, a)
            row_source.append(s)

    for (s, row), why in stream:
        if why is not None:
            dropped[s][why.rule] += 1
            continue
        batch.append((s, row))
        if len(batch) >= _BATCH:
            flush(batch)
            batch = []
    flush(batch)
    shards = writer.close()
    owners = np.asarray(row_source, dtype=np.int32)
    samples = mixture_samples(owners, [s.epochs for s in sources])
    np.save(out / "samples.npy", samples)
    manifest = {"format": FORMAT, "rows": len(owners), "samples": len(samples), "dtype": "uint32",
                "shards": shards, "sources": [s.label for s in sources], "recipe": recipe_fingerprint(cfg)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    stats = _stats(cfg, ShardedExamples(out), owners, samples, passes[-1] if passes else {}, dropped)
    seconds = time.perf_counter() - start
    rows_in = sum(s["rows_in"] for s in stats["sources"])
    stats.update(seconds=round(seconds, 3), rows_per_s=round(rows_in / max(seconds, 1e-9), 1))
    if decon is not None:
        stats["decontamination"] = {"against": data.decontaminate, "threshold": data.jaccard_threshold,
                                    **decon.counts.as_dict()}
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def _stats(cfg: Config, shards: ShardedExamples, owners: np.ndarray, samples: np.ndarray,
           counts: dict[str, SourceCounts], dropped: list[dict[str, int]]) -> dict[str, Any]:
    p, a = shards.row_lengths()
    per_source, L, cap = [], cfg.text.canvas_len, cfg.text.prompt_cap
    for s, src in enumerate(cfg.data.resolved_sources()):
        tally = counts.get(src.label, SourceCounts())
        mine = samples[owners[samples] == s] if len(samples) else samples
        per_source.append({"name": src.label, "rows_in": tally.rows_in, "filtered": dict(tally.filtered),
                           "rows_after_filters": tally.rows_out, "decontaminated": dropped[s],
                           "rows_out": int((owners == s).sum()), "epochs": src.epochs,
                           **token_stats(p[mine], a[mine], L, cap)})
    total = token_stats(p[samples], a[samples], L, cap)
    epochs = cfg.train.epochs
    return {"paper": cfg.data.paper, "template": cfg.data.template, "canvas_len": L, "prompt_cap": cap,
            "rows": len(owners), "sources": per_source, "total": total,
            "train_epochs": epochs, "train_tokens": math.floor(total["tokens"] * epochs) if epochs else None}
