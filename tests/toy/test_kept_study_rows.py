"""The toy-study record quotes tables that the study report makes from the rows kept in
``docs/toy-study/``: the report, run on those rows today, must give the page's numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elfreg.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "records" / "2026-12-02-toy-study-format-1-student.md"  # the record of those runs
# (kept folder, plan, overrides, the page's section that quotes its one-training-run table)
KEPT = [
    ("level1-t2", "configs/study-toy-level1-2400.yaml", ["train_seeds=[2]"], "### Training seed 2"),
    ("level2", "configs/study-toy-level2-curriculum.yaml", [], "## Multi-step problems"),
]
CELL = re.compile(r"^(\d+\.\d) \(n/a, (\d+\.\d)\)$")


def report(folder: str, plan: str, overrides: list[str], capsys) -> str:
    """What ``elfreg study --report`` prints for a folder kept in ``docs/toy-study/``."""
    assert main(["study", "--plan", str(ROOT / plan), "--out", str(ROOT / "docs" / "toy-study" / folder),
                 "--report", *overrides]) == 0
    return capsys.readouterr().out


def by_nfe_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """(model, sampler) → the NFE cells of the first by-NFE table in ``text``, as printed."""
    rows = {}
    for line in text.split("| model | sampler | NFE 4 |", 1)[1].splitlines()[2:]:
        if not line.startswith("| "):
            break
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        rows[(parts[0], parts[1])] = parts[2:]
    return rows


def report_cells(folder: str, plan: str, overrides: list[str], capsys) -> dict[tuple[str, str], list[str]]:
    """(model, sampler) → its by-NFE cells as the page writes one training run: ``mean (± s)``,
    ``–`` where the cell was not run."""
    by_nfe = by_nfe_rows(report(folder, plan, overrides, capsys).split("pass@1 (%) by NFE", 1)[1])
    written = {}
    for key, cells in by_nfe.items():
        matches = [CELL.match(cell.rstrip("*").strip()) for cell in cells]
        written[key] = [f"{m[1]} (± {m[2]})" if m else "–" for m in matches]
    return written


def page_rows(section: str) -> dict[tuple[str, str], list[str]]:
    """(model, sampler) → the NFE cells of the first table in ``section`` of the page."""
    text = PAGE.read_text(encoding="utf-8").split(section + "\n", 1)[1]
    rows = {}
    for line in text.splitlines():
        if line.startswith("#"):
            break
        if line.startswith("| ") and "NFE" not in line and "---" not in line:
            parts = [p.strip() for p in line.strip().strip("|").split("|")]
            rows.setdefault((parts[0], parts[1]), [p for p in parts[2:] if not p.endswith("%")])
    return rows


@pytest.mark.parametrize(("folder", "plan", "overrides", "section"), KEPT, ids=[k[0] for k in KEPT])
def test_the_page_quotes_what_the_kept_rows_report(folder, plan, overrides, section, capsys):
    reported = report_cells(folder, plan, overrides, capsys)
    quoted = page_rows(section)
    assert reported and set(reported) == set(quoted)
    for key, cells in reported.items():
        assert quoted[key] == cells, key


LATEST = ROOT / "docs" / "toy-study.md"  # the manual quotes the latest three-seed table
THREE_SEEDS = re.compile(r"^\d+\.\d \(\d+\.\d, \d+\.\d\)$")


def test_the_manual_quotes_the_latest_three_seed_table(capsys):
    """docs/toy-study.md's by-NFE table is the report of docs/toy-study/level1-96-wide, the 96-wide recipe's
    study (all 972 cells: complete rows, no cell marked missing), digit for digit."""
    out = report("level1-96-wide", "configs/study-toy-level1-96-wide.yaml", [], capsys)
    assert "972 of 972 evaluation cells finished" in out
    reported = by_nfe_rows(out.split("pass@1 (%) by NFE", 1)[1])
    quoted = by_nfe_rows(LATEST.read_text(encoding="utf-8").split("## The latest table", 1)[1])
    assert len(reported) == 27 and set(quoted) == set(reported)
    for key, cells in reported.items():
        assert all(THREE_SEEDS.match(c) for c in cells), (key, cells)
        assert quoted[key] == cells, key
