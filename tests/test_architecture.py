"""The shape of the house (docs/architecture.md): import directions and the one update loop. Module
sizes are a guideline of docs/architecture.md, not a test: ideas decide where code lives."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "elfreg"
CORE_ROOMS = ("text", "model", "flow", "sampling")
HARNESSES = ("toy", "eval", "train", "data", "analysis", "interop", "serve")


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


def test_import_directions():
    """Core rooms import no harness; only toy/ (the study grid included) and the CLI name a toy
    module. One test over every module, its failures listed together."""
    bad = []
    for path in _modules():
        room, names = _room(path), _imported(path)
        where = path.relative_to(PACKAGE)
        if room in CORE_ROOMS:
            bad += [f"{where}: the core room {room}/ imports {n}" for n in sorted(names)
                    if n.split(".")[1] in HARNESSES]
        if room not in ("toy", "cli"):
            bad += [f"{where}: names the toy module {n}" for n in sorted(names) if n.startswith("elfreg.toy")]
    assert bad == []


# What the analysis room may read: settings, the sampling room, the tasks' checkers, and the shared
# checkpoint, file, run-folder and plug-in helpers.
ANALYSIS_IMPORTS = ("config", "device", "sampling", "eval.tasks", "checkpoint", "jsonl", "runs", "plugins", "analysis")


def test_the_analysis_room_imports_only_its_table():
    bad = [f"{path.name}: {n}" for path in sorted((PACKAGE / "analysis").glob("*.py")) for n in sorted(_imported(path))
           if n != "elfreg" and not any(n == f"elfreg.{m}" or n.startswith(f"elfreg.{m}.") for m in ANALYSIS_IMPORTS)]
    assert bad == [], f"analysis/ may import only {ANALYSIS_IMPORTS}"


def test_the_samplers_share_one_update_loop():
    loops = []
    for path in sorted((PACKAGE / "sampling").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for loop in (n for n in ast.walk(fn) if isinstance(n, ast.For | ast.While)):
                calls = {c.func.id for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                if "predict" in calls:
                    loops.append(f"{path.name}:{fn.name}")
    # one function holds the loop (its inner loop runs each canvas length of a step)
    assert set(loops) == {"samplers.py:follow_path"}, loops


# Shared work with one home each: folders written whole, run-folder locks, torchrun's environment,
# JSONL lines.
TORCHRUN_ENV = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                "TORCHELASTIC_RESTART_COUNT"}


def _jsonl_line(node: ast.AST) -> bool:
    """``json.dumps(x) + "\\n"`` without ``indent``: one JSONL line written by hand."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Call)
            and isinstance(node.left.func, ast.Attribute) and node.left.func.attr == "dumps"
            and not any(k.arg == "indent" for k in node.left.keywords)
            and isinstance(node.right, ast.Constant) and node.right.value == "\n")


def test_shared_work_has_one_home():
    bad = []
    for path in _modules():
        where = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        if where != "runs.py" and any(n.split(".")[0] == "fcntl" for n in _stdlib_imports(tree)):
            bad.append(f"{where}: takes file locks (runs.py is their home)")
        if where != "distributed.py":
            bad += [f"{where}: reads torchrun's {n.value}" for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and n.value in TORCHRUN_ENV]
        if where != "jsonl.py" and any(_jsonl_line(n) for n in ast.walk(tree)):
            bad.append(f"{where}: writes JSONL lines by hand (jsonl.py is their home)")
        if where not in ("folders.py", "eval/code/sandbox/supervisor.py") and any(
                isinstance(n, ast.Attribute) and n.attr == "mkdtemp" for n in ast.walk(tree)):
            bad.append(f"{where}: makes a temporary folder to fill (folders.py writes folders whole)")
    assert bad == []


def _stdlib_imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names
