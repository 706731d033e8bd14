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
    ("level2-adamw", "configs/study-toy-level2-adamw-curriculum.yaml", [], "## Multi-step problems"),
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


# (kept folder, plan, the page that quotes its by-NFE table, the section it is in)
THREE_SEED_GRIDS = [
    ("level1", "configs/study-toy-level1.yaml", "docs/toy-study.md", "## The latest table"),
    ("level1-96-wide", "configs/study-toy-level1-96-wide.yaml", "docs/records/2026-12-05-toy-study-demo-recipe.md",
     "## pass@1 (%) by NFE over the three runs"),
]
THREE_SEEDS = re.compile(r"^\d+\.\d \(\d+\.\d, \d+\.\d\)$")


@pytest.mark.parametrize(("folder", "plan", "page", "section"), THREE_SEED_GRIDS, ids=[g[0] for g in THREE_SEED_GRIDS])
def test_the_pages_quote_the_three_seed_tables(folder, plan, page, section, capsys):
    """docs/toy-study.md's by-NFE table is the report of docs/toy-study/level1 (today's recipe), and
    the 96-wide record's that of docs/toy-study/level1-96-wide: each study complete (all 972 cells,
    no cell marked missing), digit for digit."""
    out = report(folder, plan, [], capsys)
    assert "972 of 972 evaluation cells finished" in out
    reported = by_nfe_rows(out.split("pass@1 (%) by NFE", 1)[1])
    quoted = by_nfe_rows((ROOT / page).read_text(encoding="utf-8").split(section, 1)[1])
    assert len(reported) == 27 and set(quoted) == set(reported)
    for key, cells in reported.items():
        assert all(THREE_SEEDS.match(c) for c in cells), (key, cells)
        assert quoted[key] == cells, key
