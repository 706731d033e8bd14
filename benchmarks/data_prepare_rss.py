"""Throughput and peak memory of ``elfreg data prepare`` on synthetic rows.

    python benchmarks/data_prepare_rss.py --rows 1000000
    python benchmarks/data_prepare_rss.py --rows 200000 --decontaminate gsm8k

Writes ``--rows`` synthetic GSM8K-like rows (OpenMathInstruct-2's fields) to a JSONL file,
trains a small BPE tokenizer on a sample of them, then runs ``elfreg data prepare`` (gsm8k
template, one source with a ``problem_source`` filter that keeps three rows in four) in a child
process and reports its wall time, rows per second and peak resident memory (the child's
``ru_maxrss``). Exits non-zero when the peak is over ``--max-rss-gb`` (default 2).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "coins", "shells"]
SOURCES = ["gsm8k", "augmented_gsm8k", "augmented_gsm8k", "augmented_math"]


def synthetic_row(rng: random.Random) -> dict:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 99), rng.randint(2, 20), rng.randint(1, 50)
    problem = (f"{name} has {a} boxes of {item} with {b} {item} in each box. {name} gives away {c} {item} "
               f"to friends and then buys {b} more boxes. How many {item} does {name} have now?")
    total = a * b - c + b * b
    solution = (f"{name} starts with {a} * {b} = {a * b} {item}. After giving away {c}, {name} has "
                f"{a * b} - {c} = {a * b - c}. Buying {b} boxes adds {b} * {b} = {b * b}, so the total is "
                f"{a * b - c} + {b * b} = {total}. The answer is \\boxed{{{total}}}.")
    return {"problem": problem, "generated_solution": solution, "expected_answer": str(total),
            "problem_source": rng.choice(SOURCES)}


def build_tokenizer(sample: list[str], folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<eos>", "<unk>"]))
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--decontaminate", default="", help="comma-separated benchmarks (default: none)")
    p.add_argument("--max-rss-gb", type=float, default=2.0)
    p.add_argument("--workdir", help="keep the files here (default: a temporary folder)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        rng, sample = random.Random(0), []
        t0 = time.perf_counter()
        with open(root / "rows.jsonl", "w") as f:
            for i in range(args.rows):
                row = synthetic_row(rng)
                if i < 20_000:
                    sample += [row["problem"], row["generated_solution"]]
                f.write(json.dumps(row) + "\n")
        build_tokenizer(sample, root / "tokenizer")
        print(f"wrote {args.rows:,} rows and a tokenizer in {time.perf_counter() - t0:.1f} s")
        cfg = {"text": {"encoder": str(root / "tokenizer"), "teacher": None, "canvas_len": 1024, "prompt_cap": 256},
               "model": {"repa": False, "extra_token": "none"},
               "data": {"source": "mixture", "template": "gsm8k", "prepared": str(root / "prepared"),
                        "decontaminate": [b for b in args.decontaminate.split(",") if b],
                        "sources": [{"kind": "jsonl", "path": str(root / "rows.jsonl"), "prompt_field": "problem",
                                     "answer_field": "generated_solution", "filters": [
                                         {"field": "problem_source", "keep": ["gsm8k", "augmented_gsm8k"]}]}]},
               "train": {"epochs": 12}}
        (root / "recipe.yaml").write_text(yaml.safe_dump(cfg))
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "elfreg.cli", "data", "prepare", "--config",
                               str(root / "recipe.yaml")], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode:
            sys.exit(f"prepare failed: {done.stderr.strip()}")
        peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB on Linux
        stats = json.loads((root / "prepared" / "stats.json").read_text())
        print(done.stdout.strip().splitlines()[-1])
        print(f"rows in {args.rows:,}; samples {stats['total']['samples']:,}; tokens {stats['total']['tokens']:,}; "
              f"wall {seconds:.1f} s ({args.rows / seconds:,.0f} rows/s, prepare's own {stats['rows_per_s']:,.0f}); "
              f"peak RSS {peak_gb:.2f} GB")
        if peak_gb > args.max_rss_gb:
            sys.exit(f"peak RSS {peak_gb:.2f} GB is over {args.max_rss_gb} GB")


if __name__ == "__main__":
    main()
