"""Agreement of elfreg's HumanEval+/MBPP+ verdicts with EvalPlus's own evaluator, offline.

    pip install evalplus==0.3.1
    python benchmarks/evalplus_agreement.py [--data-dir DATA] [--limit N] [--mutants 150]
                                            [--workers 2] [--out agreement.json]

For each dataset (HumanEval+ v0.1.10, MBPP+ v0.2.0; the first ``--limit`` problems) the same
programs are judged by both evaluators: every canonical solution, every canonical solution with a
planted bug (each ``return X`` of the entry point becomes ``return (X, 'planted bug')``), and
``--mutants`` single-site mutants of canonical solutions (seeded: an arithmetic, comparison or
boolean operator swapped, or an integer constant moved by one). elfreg judges with
``Task.check_many`` (sanitiser + sandbox + ``_harness.py``); EvalPlus with
``evalplus.evaluate.check_correctness`` on the raw program, expected outputs from its own
``get_groundtruth``, its default time limits and ``fast_check``. EvalPlus reads the local release
files through ``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH`` (set here before it is
imported), so nothing is downloaded.

Compared verdicts: ``base`` (elfreg: the task's base score; EvalPlus: the base inputs) and
``plus`` (elfreg: base + plus inputs; EvalPlus: base and plus both pass, as its "base + extra"
score). Prints one table row per dataset and program kind and lists every disagreement; ``--out``
writes them all as JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from elfreg.paths import data_dir

FILES = {"humaneval": "HumanEvalPlus-v0.1.10.jsonl", "mbpp": "MbppPlus-v0.2.0.jsonl"}
SWAPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv,
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.And: ast.Or, ast.Or: ast.And,
}


def _sites(tree: ast.AST, first_line: int) -> list[tuple[ast.AST, str, int]]:
    """Mutable places in the solution part (lines >= ``first_line``): (node, kind, index)."""
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) < first_line:
            continue
        if isinstance(node, ast.BinOp | ast.BoolOp) and type(node.op) in SWAPS:
            out.append((node, "op", 0))
        elif isinstance(node, ast.Compare):
            out += [(node, "cmp", i) for i, op in enumerate(node.ops) if type(op) in SWAPS]
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append((node, "const", 0))
    return out


def mutate(program: str, prompt: str, rng: random.Random) -> tuple[str, str] | None:
    """(mutant source, description) with one site changed, or None when nothing changed."""
    tree = ast.parse(program)
    sites = _sites(tree, prompt.count("\n") + 1)
    if not sites:
        return None
    node, kind, i = rng.choice(sites)
    if kind == "op":
        old = type(node.op).__name__
        node.op = SWAPS[type(node.op)]()
        what = f"{old} -> {type(node.op).__name__}"
    elif kind == "cmp":
        old = type(node.ops[i]).__name__
        node.ops[i] = SWAPS[type(node.ops[i])]()
        what = f"{old} -> {type(node.ops[i]).__name__}"
    else:
        what = f"{node.value} -> {node.value + 1}"
        node.value += 1
    source = ast.unparse(tree)
    return (source, f"line {node.lineno}: {what}") if source != ast.unparse(ast.parse(program)) else None


class _Returns(ast.NodeTransformer):
    """Wraps the returns it meets, not those of nested functions, lambdas or classes."""

    found = False

    def _skip(self, node: ast.AST) -> ast.AST:
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _skip

    def visit_Return(self, node: ast.Return) -> ast.Return:
        self.found = True
        node.value = ast.Tuple([node.value or ast.Constant(None), ast.Constant("planted bug")], ast.Load())
        return node


def plant_bug(program: str, entry: str) -> str:
    """The program with every ``return X`` of ``entry`` (not of nested functions) returning
    ``(X, 'planted bug')``; a function without a return gets ``return 'planted bug'`` first."""
    tree = ast.parse(program)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == entry)
    planter = _Returns()
    fn.body = [planter.visit(stmt) for stmt in fn.body]
    if not planter.found:
        fn.body.insert(0, ast.Return(ast.Constant("planted bug")))
    return ast.unparse(ast.fix_missing_locations(tree))


def programs(problems: list[dict[str, Any]], mutants: int, seed: int) -> list[dict[str, Any]]:
    """Every program to judge: {task_id, kind, what, source}."""
    rng = random.Random(seed)
    out = []
    for p in problems:
        canonical = p["prompt"] + p["canonical_solution"]
        out.append({"task_id": p["task_id"], "kind": "canonical", "what": "", "source": canonical})
        out.append({"task_id": p["task_id"], "kind": "planted bug", "what": "return (X, 'planted bug')",
                    "source": plant_bug(canonical, p["entry_point"])})
    seen, made, tries = set(), 0, 0
    while made < mutants and tries < 20 * mutants:
        tries += 1
        p = rng.choice(problems)
        got = mutate(p["prompt"] + p["canonical_solution"], p["prompt"], rng)
        if got is None or (p["task_id"], got[0]) in seen:
            continue
        seen.add((p["task_id"], got[0]))
        out.append({"task_id": p["task_id"], "kind": "mutant", "what": got[1], "source": got[0]})
        made += 1
    return out


def _evalplus_one(args: tuple) -> tuple[str, str]:
    from evalplus.evaluate import check_correctness

    dataset, problem, source, expected = args
    ret = check_correctness(dataset, 0, problem, source, expected, fast_check=True)
    return ret["base"][0], ret["plus"][0]


def judge_evalplus(dataset: str, ids: list[str], progs: list[dict[str, Any]], workers: int) -> list[tuple[str, str]]:
    """EvalPlus's (base status, plus status) for each program (its problems and ground truth)."""
    from evalplus.data import get_human_eval_plus, get_mbpp_plus
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
    from evalplus.evaluate import get_groundtruth

    every = get_human_eval_plus() if dataset == "humaneval" else get_mbpp_plus()
    problems = {t: every[t] for t in ids}
    not_none = [] if dataset == "humaneval" else MBPP_OUTPUT_NOT_NONE_TASKS
    expected = get_groundtruth(problems, f"elfreg-agreement-{dataset}-{len(ids)}-{ids[-1].replace('/', '_')}",
                               not_none)
    jobs = [(dataset, problems[p["task_id"]], p["source"], expected[p["task_id"]]) for p in progs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_evalplus_one, jobs, chunksize=4))


def judge_elfreg(task: Any, progs: list[dict[str, Any]], workers: int) -> list[Any]:
    """elfreg's verdicts (``Verdict.scores`` has base and plus) for each program."""
    samples = [(task.problem(p["task_id"]), p["source"], "solution") for p in progs]
    return task.check_many(samples, workers=workers)


def compare(dataset: str, progs: list[dict[str, Any]], ours: list[Any], theirs: list[tuple[str, str]]):
    """(table rows, disagreements)."""
    rows, disagreements = {}, []
    for prog, verdict, (ev_base, ev_plus) in zip(progs, ours, theirs, strict=True):
        mine = {"base": bool(verdict.scores.get("base")), "plus": bool(verdict.scores.get("plus"))}
        other = {"base": ev_base == "pass", "plus": ev_base == "pass" and ev_plus == "pass"}
        row = rows.setdefault(prog["kind"], {"n": 0, "base": 0, "plus": 0, "pass_ours": [0, 0], "pass_ev": [0, 0]})
        row["n"] += 1
        for k, score in enumerate(("base", "plus")):
            row[score] += mine[score] == other[score]
            row["pass_ours"][k] += mine[score]
            row["pass_ev"][k] += other[score]
            if mine[score] != other[score]:
                disagreements.append({"dataset": dataset, "task_id": prog["task_id"], "kind": prog["kind"],
                                      "what": prog["what"], "score": score, "elfreg": mine[score],
                                      "evalplus": [ev_base, ev_plus], "elfreg_reason": verdict.reason,
                                      "source": prog["source"]})
    return rows, disagreements


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=str(data_dir()), help="the benchmark copies (default: elfreg's data "
                    "directory, $ELFREG_DATA_DIR or data/ in the user cache)")
    ap.add_argument("--datasets", default="humaneval,mbpp")
    ap.add_argument("--limit", type=int, default=0, help="first N problems of each dataset (0: all)")
    ap.add_argument("--mutants", type=int, default=150, help="mutated programs per dataset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="write the table and every disagreement here (JSON)")
    args = ap.parse_args(argv)
    local = Path(args.data_dir) / "evalplus"
    os.environ["HUMANEVAL_OVERRIDE_PATH"] = str((local / FILES["humaneval"]).resolve())
    os.environ["MBPP_OVERRIDE_PATH"] = str((local / FILES["mbpp"]).resolve())
    from evalplus import __version__ as evalplus_version

    from elfreg.eval.tasks.code import HumanEvalPlusTask, MbppPlusTask

    report: dict[str, Any] = {"evalplus": evalplus_version, "args": vars(args), "table": {}, "disagreements": []}
    for dataset in args.datasets.split(","):
        task = (HumanEvalPlusTask if dataset == "humaneval" else MbppPlusTask)(data_dir=args.data_dir, source="local")
        problems = task.problems()[: args.limit or None]
        progs = programs(problems, args.mutants, args.seed)
        start = time.time()
        ours = judge_elfreg(task, progs, args.workers)
        mid = time.time()
        theirs = judge_evalplus(dataset, [p["task_id"] for p in problems], progs, args.workers)
        rows, dis = compare(dataset, progs, ours, theirs)
        report["table"][dataset] = rows
        report["disagreements"] += dis
        print(f"{dataset}: {len(problems)} problems, {len(progs)} programs; elfreg {mid - start:.0f} s, "
              f"evalplus {time.time() - mid:.0f} s", file=sys.stderr)
    print("| dataset | programs | n | base agree | plus agree | pass base (elfreg / EvalPlus) "
          "| pass plus (elfreg / EvalPlus) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for dataset, rows in report["table"].items():
        for kind, r in rows.items():
            print(f"| {dataset}+ | {kind} | {r['n']} | {r['base']}/{r['n']} ({100 * r['base'] / r['n']:.1f} %) | "
                  f"{r['plus']}/{r['n']} ({100 * r['plus'] / r['n']:.1f} %) | {r['pass_ours'][0]} / {r['pass_ev'][0]} "
                  f"| {r['pass_ours'][1]} / {r['pass_ev'][1]} |")
    print(f"\n{len(report['disagreements'])} disagreement(s)")
    for d in report["disagreements"]:
        print(f"- {d['dataset']} {d['task_id']} {d['kind']} {d['what']} [{d['score']}]: elfreg "
              f"{'pass' if d['elfreg'] else 'fail'} ({d['elfreg_reason'][:120]}), EvalPlus base/plus {d['evalplus']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
