"""Run a study's cells into one folder, resumably.

Layout of ``--out``::

    .lock            held for the life of the run (a second study or demo refuses the folder)
    plan.json        the resolved plan and its identity
    runs/<model>/t<seed>/   one training cell: an ordinary ``elfreg train`` folder
    results.jsonl    one row per finished evaluation cell, appended as each one ends (with the
                     code version that made it, :func:`elfreg.provenance.code_version`)
    results.json, table.md, pass1_vs_nfe.png   written when every cell is done (:mod:`.report`)
    distill/<model>/t<seed>/round<k>-<N>step/  with a ``distill`` section: an ``elfreg distill``
                     folder of each distilled training cell, one run folder per round
    distilled.jsonl  one row per finished distilled cell, as ``results.jsonl``

Training goes through the demo's :func:`~elfreg.toy.demo.train_variant` (``elfreg.train``'s
resumable, locked loop; a finished run is reused), evaluation through the demo's
:func:`~elfreg.toy.demo.evaluate` (the toy scorer, one sampling seed per cell), distillation
through :func:`elfreg.train.distill.distill` (resumable as training) once a cell's evaluations
are done. A re-run after a
kill skips every cell whose row is in ``results.jsonl``, resumes an interrupted training from its
newest intact checkpoint, and drops a row cut mid-write.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from elfreg.checkpoint import open_checkpoint, resolve_checkpoint
from elfreg.config import Config, SampleConfig
from elfreg.jsonl import append_jsonl, drop_cut_last_line, read_jsonl
from elfreg.provenance import code_version
from elfreg.runs import GracefulInterrupt, first_difference, locked, write_json_atomic
from elfreg.text.load import FrozenText, load_frozen_text
from elfreg.toy.demo import evaluate, heldout_problems, train_variant
from elfreg.toy.study.plan import (
    DistilledCell,
    EvalCell,
    Study,
    TrainCell,
    sample_settings_match,
    training_settings,
)
from elfreg.toy.study.report import build_report, write_outputs

PLAN_FILE = "plan.json"
ROWS_FILE = "results.jsonl"
DISTILLED_ROWS_FILE = "distilled.jsonl"
MADE_BY_DISTILLATION = ("distill", DISTILLED_ROWS_FILE)
MADE_BY_A_STUDY = ("runs", ROWS_FILE, PLAN_FILE, "results.json", "table.md", "pass1_vs_nfe.png",
                   *MADE_BY_DISTILLATION)


class StudyInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the study after a finished cell."""

    exit_status = 130


def run_dir(out: Path, cell: TrainCell) -> Path:
    return out / "runs" / cell.model / f"t{cell.train_seed}"


def distill_dir(out: Path, cell: TrainCell) -> Path:
    """The ``train.out_dir`` of ``cell``'s distillation: its rounds' parent."""
    return out / "distill" / cell.model / f"t{cell.train_seed}"


def stored_plan(out: Path) -> dict | None:
    """The resolved plan recorded in ``out`` (None for a folder without one)."""
    path = out / PLAN_FILE
    return json.loads(path.read_text()) if path.exists() else None


def stored_identity(out: Path) -> str | None:
    """The identity of the plan recorded in ``out`` (None for a folder without one)."""
    held = stored_plan(out)
    return None if held is None else held["identity"]


def clashes(study: Study, held: dict | None) -> list[str]:
    """Models of ``study`` that the folder's recorded plan ``held`` trained with other settings,
    each with the first setting that differs (``"elf: train.steps"``). Evaluation axes
    (samplers, NFEs, sampling seeds) and models or training seeds that are new never clash."""
    if held is None:
        return []
    before, now = training_settings(held["plan"]), training_settings(study.to_dict())
    return [f"{name}: {first_difference(before[name], now[name])}" for name in now
            if name in before and before[name] != now[name]]


def distill_clash(study: Study, held: dict | None) -> str | None:
    """The first setting in which the folder's recorded distillation differs from ``study``'s
    (``"distill: train.lr"``); None when they agree or either plan distils nothing. The models
    distilled and the samplers that score them are axes that may grow, never a clash."""
    before = (held or {}).get("plan", {}).get("distill")
    now = study.to_dict().get("distill")
    if not before or not now or before["config"] == now["config"]:
        return None
    return f"distill: {first_difference(before['config'], now['config'])}"


def _remove(out: Path, names: tuple[str, ...]) -> None:
    for name in names:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def claim_folder(study: Study, out: Path, overwrite: bool = False) -> None:
    """Make ``out`` the folder of ``study`` and record its plan there. A study folder grows: a
    plan may add models, training seeds, samplers, NFEs and sampling seeds to what the folder
    holds, and every finished cell is kept. A model the folder trained with other settings is
    refused in one line; ``overwrite`` discards everything the folder's plans made (training
    runs included) first. A distillation the folder made with other settings is refused
    likewise; ``overwrite`` discards only the distilled students and their rows then. A folder
    that holds anything but a study is refused whatever ``overwrite`` says."""
    held = stored_plan(out)
    if held is None and out.is_dir():
        foreign = sorted(p.name for p in out.iterdir()
                         if p.name != ".lock" and not p.name.startswith(f".{PLAN_FILE}.tmp"))
        if foreign:
            raise ValueError(f"{out} is not a study folder (it holds {', '.join(foreign[:3])}"
                             f"{', ...' if len(foreign) > 3 else ''}); choose an empty or new --out")
    clash = clashes(study, held)
    if clash:
        if not overwrite:
            raise ValueError(f"{out} holds models trained with other settings ({'; '.join(clash)}); choose "
                             "another --out, or pass --overwrite to discard what is there")
        _remove(out, MADE_BY_A_STUDY)
    elif (distilled := distill_clash(study, held)) is not None:
        if not overwrite:
            raise ValueError(f"{out} holds students distilled with other settings ({distilled}); choose another "
                             "--out, or pass --overwrite to discard the distilled students")
        _remove(out, MADE_BY_DISTILLATION)
    if held is None or clash or held["identity"] != study.identity():
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / PLAN_FILE, {"identity": study.identity(), "plan": study.to_dict()})


def finished_rows(out: Path, repair: bool = True, name: str = ROWS_FILE) -> dict[str, dict]:
    """Rows of finished evaluation cells (distilled cells: ``name`` :data:`DISTILLED_ROWS_FILE`)
    by cell id. A row cut by a kill is dropped from the file first; with ``repair`` false nothing
    is written and such a row is only skipped."""
    path = out / name
    if not path.exists():
        return {}
    if repair:
        drop_cut_last_line(path)
        return {row["cell"]: row for row in read_jsonl(path)}
    rows = {}
    for line in path.read_bytes().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        rows[row["cell"]] = row
    return rows


def rows_of(study: Study, rows: dict[str, dict]) -> dict[str, dict]:
    """The rows that are finished cells of ``study``: the cell is in the plan and the row was
    sampled with the settings the plan gives it now (:func:`sample_settings_match`); a row made
    under another definition of the same sampler name is not one, and the cell runs again."""
    return {c.id: rows[c.id] for c in study.eval_cells()
            if c.id in rows and sample_settings_match(rows[c.id].get("sample", {}), study.sample_config(c))}


def distilled_rows_of(study: Study, rows: dict[str, dict]) -> dict[str, dict]:
    """As :func:`rows_of`, for the distilled cells."""
    return {c.id: rows[c.id] for c in study.distilled_cells()
            if c.id in rows and sample_settings_match(rows[c.id].get("sample", {}), study.distilled_sample_config(c))}


def training_done(study: Study, out: Path, cell: TrainCell) -> bool:
    ckpt = resolve_checkpoint(run_dir(out, cell))
    return ckpt is not None and open_checkpoint(ckpt).meta["step"] >= study.models[cell.model].train.steps


def adopt_run(study: Study, out: Path, cell_id: str, source: str | Path) -> Path:
    """Copy the training run folder ``source``, made outside the study (``elfreg demo --config
    BASE --seeds S``, ``elfreg train``), into ``out`` as the training cell ``cell_id``
    (``elf-reg/t1``), so the study evaluates it instead of training it again; returns its new
    folder. Refused in one line, with nothing written, when the cell is not in the plan, already
    has a folder, or ``source`` holds no checkpoint, is in use, or was configured otherwise than
    the plan trains the cell: any difference in the ``text``, ``model``, ``flow``, ``loss`` or
    ``data`` section, or in a train setting that sets a run's course
    (:func:`~elfreg.train.build.course_changes`; under a cosine schedule its length). A run
    stopped before the plan's steps is adopted and finished by the study. The copy is written whole or not at all."""
    from elfreg.folders import written_whole
    from elfreg.train.build import course_changes

    cells = {c.id: c for c in study.train_cells()}
    if cell_id not in cells:
        raise ValueError(f"--adopt: {cell_id!r} is not a training cell of this plan "
                         f"(its cells: {', '.join(cells)})")
    source = Path(source)
    ckpt_path = resolve_checkpoint(source) if source.is_dir() else None
    if ckpt_path is None:
        raise ValueError(f"--adopt {cell_id}: {source} holds no checkpoint (give a run folder)")
    with locked(out, what="study folder"), locked(source):
        claim_folder(study, out)
        target = run_dir(out, cells[cell_id])
        if target.exists():
            raise ValueError(f"--adopt {cell_id}: the study already has {target}; remove it first to replace it")
        wanted = study.run_config(cells[cell_id], target)
        changes = course_changes(wanted, open_checkpoint(ckpt_path).config)
        if changes:
            raise ValueError(f"--adopt {cell_id}: {source} was not trained as this plan trains {cell_id} "
                             f"({'; '.join(changes)})")
        with written_whole(target) as tmp:
            shutil.copytree(source, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".lock"))
    return target


def status(study: Study, out: Path) -> dict:
    """What is done in ``out`` for ``study``, without touching anything (``--dry-run``)."""
    held = stored_plan(out) if out.is_dir() else None
    clash = clashes(study, held)
    usable = held is not None and not clash
    rows = rows_of(study, finished_rows(out, repair=False)) if usable else {}
    distilled = distill_clash(study, held)
    drows = (distilled_rows_of(study, finished_rows(out, repair=False, name=DISTILLED_ROWS_FILE))
             if usable and distilled is None else {})
    cells = []
    for cell in study.train_cells():
        evals, dcells = study.eval_cells(cell), study.distilled_cells(cell)
        cells.append({"cell": cell.id, "trained": usable and training_done(study, out, cell),
                      "eval_cells": len(evals), "eval_done": sum(c.id in rows for c in evals),
                      "distilled_cells": len(dcells), "distilled_done": sum(c.id in drows for c in dcells)})
    return {"out": str(out), "identity": study.identity(), "held_identity": held and held["identity"],
            "clashes": clash + ([distilled] if distilled else []), "training": cells}


def report_so_far(study: Study, out: Path) -> dict:
    """The report of the cells finished in ``out`` so far (``--report``), read without the lock
    and without writing: a study may be running there. Entries with missing cells say
    ``complete: False``."""
    held = stored_plan(out) if out.is_dir() else None
    if held is None:
        raise ValueError(f"{out} holds no study")
    clash = clashes(study, held)
    if clash:
        raise ValueError(f"{out} holds models trained with other settings ({'; '.join(clash)})")
    distilled = distill_clash(study, held)
    if distilled is not None:
        raise ValueError(f"{out} holds students distilled with other settings ({distilled})")
    return build_report(study, rows_of(study, finished_rows(out, repair=False)),
                        {c.id: run_dir(out, c) for c in study.train_cells()},
                        distilled_rows_of(study, finished_rows(out, repair=False, name=DISTILLED_ROWS_FILE)))


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def _row(cell: EvalCell | DistilledCell, sample: SampleConfig, result: dict, n_problems: int, seconds: float,
         step: int) -> dict:
    which = {"student": cell.student, "steps": cell.steps} if isinstance(cell, DistilledCell) else {}
    return {"cell": cell.id, "model": cell.model, "train_seed": cell.train_seed, **which, "sampler": cell.sampler,
            "nfe": cell.nfe, "sample_seed": cell.sample_seed, "pass@1": result["mean"],
            "token_match": result["token_match"], "nfe_used": result["nfe_used"], "n_problems": n_problems,
            "checkpoint_step": step, "eval_seconds": round(seconds, 3), "sample": asdict(sample),
            "code": code_version()}


def _score(cells: list, students: Callable[[Any], tuple[Any, int]], sample_of: Callable[[Any], SampleConfig],
           frozen: FrozenText, problems: list[dict], cfg: Config, rows_file: Path, desc: str,
           progress: bool) -> None:
    """Score each cell with the (student, checkpoint step) ``students(cell)`` gives, appending its
    row to ``rows_file`` as it ends; a signal stops after a finished cell."""
    bar = tqdm(cells, desc=desc, disable=not progress, dynamic_ncols=True)
    with GracefulInterrupt() as stop:
        for cell in bar:
            start = time.perf_counter()
            student, step = students(cell)
            sample = sample_of(cell)
            result = evaluate(student, frozen, problems, cfg, sample, 1, progress=False, seed=cell.sample_seed)
            row = _row(cell, sample, result, len(problems), time.perf_counter() - start, step)
            append_jsonl(rows_file, row)
            if stop.requested:
                raise StudyInterrupted(f"interrupted by {stop.signal_name} after evaluation cell {cell.id}; "
                                       "run the same command to resume")


def _distil(study: Study, out: Path, cell: TrainCell, progress: bool) -> dict[int, Path]:
    """Distil (or resume distilling) ``cell``'s run; every round's folder by its N."""
    from elfreg.train.distill import distill, round_folder

    dcfg = study.distill_config(cell, distill_dir(out, cell), progress)
    results = distill(dcfg, run_dir(out, cell))
    if len(results) != len(study.distill_steps) or not all(r.finished for r in results):
        raise RuntimeError(f"{cell.id}: the distillation stopped before its last round ({distill_dir(out, cell)})")
    return {n: round_folder(dcfg, k, n) for k, n in enumerate(study.distill_steps, start=1)}


def _distilled_students(folders: dict[int, Path], teacher: tuple[Any, int]
                        ) -> Callable[[DistilledCell], tuple[Any, int]]:
    """For a distilled cell, its (EMA student, checkpoint step): the teacher's, or its round's
    (each round loaded once, when first asked for)."""
    loaded: dict[int, tuple[Any, int]] = {}

    def student(cell: DistilledCell) -> tuple[Any, int]:
        if not cell.distilled:
            return teacher
        if cell.steps not in loaded:
            ckpt = open_checkpoint(folders[cell.steps])
            loaded[cell.steps] = (ckpt.load_student(use_ema=True), ckpt.meta["step"])
        return loaded[cell.steps]

    return student


def run_cell(study: Study, out: Path, cell: TrainCell, todo: list[EvalCell], dtodo: list[DistilledCell],
             label: str, progress: bool, frozen: dict[str, FrozenText] | None = None) -> None:
    """Train (or resume, or reuse) one training cell, score its evaluation cells ``todo``, then
    distil it and score its distilled cells ``dtodo``, appending each row to the folder's files
    as it ends. ``frozen`` caches the frozen encoders across calls of one process."""
    frozen = {} if frozen is None else frozen
    cfg = study.run_config(cell, run_dir(out, cell), progress)
    problems = heldout_problems(cfg)
    _say(f"{label} {cell.id}: training ({cfg.train.steps} steps)", progress)
    train_variant(cfg, problems)
    ckpt = open_checkpoint(cfg.train.out_dir)
    teacher = (ckpt.load_student(use_ema=True), ckpt.meta["step"])
    key = json.dumps(asdict(cfg.text), sort_keys=True)
    if key not in frozen:
        frozen[key] = load_frozen_text(cfg.text, with_teacher=False)
    _score(todo, lambda _, t=teacher: t, study.sample_config, frozen[key], problems, cfg, out / ROWS_FILE,
           f"{label} {cell.id} evaluation cells", progress)
    if dtodo:
        _say(f"{label} {cell.id}: distilling into {', '.join(map(str, study.distill_steps))}-step students", progress)
        students = _distilled_students(_distil(study, out, cell, progress), teacher)
        _score(dtodo, students, study.distilled_sample_config, frozen[key], problems, cfg,
               out / DISTILLED_ROWS_FILE, f"{label} {cell.id} distilled cells", progress)


def run_study(study: Study, out: str | Path, overwrite: bool = False, progress: bool = True, jobs: int = 1) -> dict:
    """Run every cell of ``study`` not yet done in ``out`` (locked meanwhile), then write the
    report; returns it (:func:`~elfreg.toy.study.report.build_report`). With ``jobs`` > 1 that
    many training cells run at a time, each in its own process (:mod:`.workers`), in the same
    order as one at a time."""
    from elfreg.toy.study.workers import run_in_processes

    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1; got {jobs}")
    out = Path(out)
    with locked(out, what="study folder"):
        claim_folder(study, out, overwrite)
        t0 = time.perf_counter()
        rows = rows_of(study, finished_rows(out))
        drows = distilled_rows_of(study, finished_rows(out, name=DISTILLED_ROWS_FILE))
        cells = study.train_cells()
        work = []
        for k, cell in enumerate(cells, 1):
            todo = [c for c in study.eval_cells(cell) if c.id not in rows]
            dtodo = [c for c in study.distilled_cells(cell) if c.id not in drows]
            if todo or dtodo:
                work.append((cell, todo, dtodo, f"[{k}/{len(cells)}]"))
        if jobs == 1 or len(work) < 2:
            frozen: dict[str, FrozenText] = {}
            for cell, todo, dtodo, label in work:
                run_cell(study, out, cell, todo, dtodo, label, progress, frozen)
        else:
            run_in_processes(study, out, work, jobs, progress)
        rows = rows_of(study, finished_rows(out, repair=False))
        drows = distilled_rows_of(study, finished_rows(out, repair=False, name=DISTILLED_ROWS_FILE))
        report = build_report(study, rows, {c.id: run_dir(out, c) for c in cells}, drows)
        report["run_seconds"] = round(time.perf_counter() - t0, 1)
        report["outputs"] = [str(p) for p in write_outputs(out, report)]
        return report
