"""``elfreg data``: ``prepare`` (a recipe into token shards), ``decontaminate`` (a file against
benchmarks) and ``stats`` (a prepared recipe beside the paper's Table 8).

    elfreg data prepare --config configs/elf-reg-b-gsm8k.yaml [--out DIR] [key.sub=value ...]
    elfreg data decontaminate --input train.jsonl --prompt-field question --answer-field answer \\
        --against gsm8k,math500 --out decon/
    elfreg data stats --config configs/elf-reg-b-gsm8k.yaml

Failures propagate to the one handler of :mod:`elfreg.cli` (one line, non-zero exit).
"""

from __future__ import annotations

import argparse
import errno
import json
from pathlib import Path

from ..config import BENCHMARKS, Config, ConfigError


def _prepare(args: argparse.Namespace) -> int:
    from .prepare import prepare
    from .stats import stats_table

    cfg = Config.load(args.config, args.override)
    out = args.out or cfg.data.prepared
    if not out:
        raise ConfigError("config error: data.prepared: give --out DIR or set data.prepared in the config")
    stats = prepare(cfg, out, data_dir=args.data_dir)
    print(stats_table(stats), end="")
    print(f"prepared {stats['total']['samples']:,} samples in {stats['seconds']:.1f} s "
          f"({stats['rows_per_s']:,.0f} rows/s) into {out}")
    return 0


def _decontaminate(args: argparse.Namespace) -> int:
    from .decontaminate import decontaminate_file

    against = [b.strip() for b in args.against.split(",") if b.strip()]
    bad = [b for b in against if b not in BENCHMARKS]
    if bad or not against:
        raise ValueError(f"--against: unknown benchmark(s) {', '.join(bad) or '(none given)'} "
                         f"(known: {', '.join(BENCHMARKS)})")
    if not 0 < args.threshold <= 1:
        raise ValueError(f"--threshold: must be in (0, 1], got {args.threshold}")
    counts = decontaminate_file(args.input, args.prompt_field, against, args.out, answer_field=args.answer_field,
                                group_field=args.group_field, threshold=args.threshold, data_dir=args.data_dir)
    rules = ", ".join(f"{k} {v}" for k, v in counts.by_rule.items())
    print(f"{counts.rows_in:,} rows: kept {counts.rows_kept:,}, dropped {counts.rows_dropped:,} ({rules}) in "
          f"{counts.groups_dropped:,} groups; written to {args.out}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from .stats import stats_table

    if not args.prepared and not args.config:
        raise ConfigError("config error: data stats: give --prepared DIR (a prepared recipe) or --config FILE")
    folder = args.prepared or Config.load(args.config).data.prepared
    if not folder:
        raise ConfigError("config error: data.prepared: give --prepared DIR or set data.prepared in the config")
    path = Path(folder) / "stats.json"
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "no statistics (run `elfreg data prepare` first)", str(path))
    print(stats_table(json.loads(path.read_text())), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="prepare, decontaminate and account for training data")
    group = p.add_subparsers(dest="data_command", required=True)
    prep = group.add_parser("prepare", help="tokenise a recipe once into memory-mapped shards with stats.json")
    prep.add_argument("--config", required=True, help="YAML config (see configs/)")
    prep.add_argument("--out", help="output folder (default: data.prepared)")
    prep.add_argument("--data-dir", help="benchmark data directory for decontamination")
    prep.add_argument("override", nargs="*", help="key.sub=value overrides")
    prep.set_defaults(func=_prepare)
    dec = group.add_parser("decontaminate", help="drop rows that match benchmark test items")
    dec.add_argument("--input", required=True, help="JSONL or Parquet file (or folder)")
    dec.add_argument("--prompt-field", required=True, help="the JSONL field holding the question")
    dec.add_argument("--answer-field", help="solution field (code benchmarks: AST rule)")
    dec.add_argument("--group-field", help="rows with the same value form a group (default: the prompt)")
    dec.add_argument("--against", required=True, help=f"comma-separated: {','.join(BENCHMARKS)}")
    dec.add_argument("--out", required=True, help="folder for kept.jsonl, dropped.jsonl, counts.json")
    dec.add_argument("--threshold", type=float, default=0.2, help="8-gram Jaccard threshold (default 0.2)")
    dec.add_argument("--data-dir", help="benchmark data directory")
    dec.set_defaults(func=_decontaminate)
    st = group.add_parser("stats", help="the accounting of a prepared recipe beside the paper's Table 8")
    st.add_argument("--config", help="YAML config whose data.prepared to read")
    st.add_argument("--prepared", help="prepared folder (default: data.prepared of --config)")
    st.set_defaults(func=_stats)
