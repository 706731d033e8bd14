"""Fakes for evaluation runs: a tiny GSM8K-style data file, and ``elfreg eval`` in this process."""

from __future__ import annotations

import json
from pathlib import Path

from elfreg.eval.cli import build_parser


def eval_main(argv: list[str]) -> int:
    """``elfreg eval ARGV`` in this process (the eval command's own handler); its exit status."""
    args = build_parser().parse_args(["eval", *argv])
    return args.func(args)


def gsm8k_file(path: Path, n: int) -> Path:
    """``n`` problems ``q<i>`` whose answer is ``i + 1``."""
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"work\n#### {i + 1}"}) + "\n"
                            for i in range(n)))
    return path
