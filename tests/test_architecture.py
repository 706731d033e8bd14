"""The shape of the house (docs/architecture.md): import directions, module sizes, one loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "elfreg"
CORE_ROOMS = ("text", "model", "flow", "sampling")
HARNESSES = ("toy", "eval", "train", "data", "study", "analysis", "interop")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imported(path: Path) -> set[str]:
    """Absolute names of the elfreg modules ``path`` imports (relative imports resolved)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                name = f"{base}.{node.module}" if node.module else base
                out.add(name)
                out |= {f"{name}.{a.name}" for a in node.names}
            elif node.module:
                out.add(node.module)
                out |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in out if n == "elfreg" or n.startswith("elfreg.")}


def _room(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_import_directions(path):
    room, names = _room(path), _imported(path)
    if room in CORE_ROOMS:
        bad = {n for n in names if n.split(".")[1] in HARNESSES}
        assert not bad, f"the core room {room}/ must not import harness rooms: {sorted(bad)}"
    if room not in ("toy", "study", "cli"):
        bad = {n for n in names if n.startswith("elfreg.toy")}
        assert not bad, f"only toy/, study/ and the CLI entry point may name a toy module: {sorted(bad)}"


# What the analysis room may read: settings, the sampling room, the tasks' checkers, and the shared
# checkpoint, file, folder and plug-in helpers (eval.outdir for the output folder's identity).
ANALYSIS_IMPORTS = ("config", "device", "sampling", "eval.tasks", "eval.outdir", "checkpoint", "jsonl", "runs",
                    "plugins", "analysis")


@pytest.mark.parametrize("path", sorted((PACKAGE / "analysis").glob("*.py")), ids=lambda p: p.name)
def test_the_analysis_room_imports_only_its_table(path):
    bad = {n for n in _imported(path) if n != "elfreg"
           and not any(n == f"elfreg.{m}" or n.startswith(f"elfreg.{m}.") for m in ANALYSIS_IMPORTS)}
    assert not bad, f"analysis/ may import only {ANALYSIS_IMPORTS}: {sorted(bad)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= 400


def test_sampling_has_at_most_nine_modules_and_one_update_loop():
    modules = sorted((PACKAGE / "sampling").glob("*.py"))
    assert len(modules) <= 9, [m.name for m in modules]
    loops = []
    for path in modules:
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for loop in (n for n in ast.walk(fn) if isinstance(n, ast.For | ast.While)):
                calls = {c.func.id for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                if "predict" in calls:
                    loops.append(f"{path.name}:{fn.name}")
    # one function holds the loop (its inner loop runs each canvas length of a step)
    assert set(loops) == {"samplers.py:follow_path"}, loops
