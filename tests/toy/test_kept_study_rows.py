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


def report_cells(folder: str, plan: str, overrides: list[str], capsys) -> dict[tuple[str, str], list[str]]:
    """(model, sampler) → its by-NFE cells as the page writes one training run: ``mean (± s)``,
    ``–`` where the cell was not run."""
    assert main(["study", "--plan", str(ROOT / plan), "--out", str(ROOT / "docs" / "toy-study" / folder),
                 "--report", *overrides]) == 0
    by_nfe = capsys.readouterr().out.split("pass@1 (%) by NFE")[1]
    cells = {}
    for line in by_nfe.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) < 3 or parts[0] in ("model", "---"):
            continue
        written = []
        for cell in parts[2:]:
            match = CELL.match(cell.rstrip("*").strip())
            written.append(f"{match[1]} (± {match[2]})" if match else "–")
        cells[(parts[0], parts[1])] = written
    return cells


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
