"""The study runner on the quick plan at test size (the tiny frozen LMs, 4 training steps, 4
held-out problems): outputs, resume after failures in evaluation and in training without
redoing a finished cell, a cut row, the folder's plan identity and its lock."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import elfreg.toy.study.runner as runner
import elfreg.train.loop as loop
from elfreg.checkpoint import resolve_checkpoint
from elfreg.cli import main
from elfreg.provenance import code_version
from elfreg.runs import FolderInUse, locked
from elfreg.toy.study.plan import load_plan

from conftest import tiny_config

QUICK = Path(__file__).resolve().parents[2] / "configs" / "study-quick.yaml"
EVALUATE, TRAIN_STEP = runner.evaluate, loop.train_step


@pytest.fixture
def plan_args(tiny_assets, tmp_path):
    """Overrides that run configs/study-quick.yaml on the tiny test assets with 4 training steps."""
    base = tiny_config(tiny_assets, tmp_path, data={"toy_count": 64}, eval={"limit": 4}).to_dict()
    return [f"base={json.dumps(base)}", "overrides={}"]


def _counting(monkeypatch, fail_eval_at=None, fail_train=None):
    """Count finished evaluations (by cell) and training steps (by run folder); raise in the
    ``fail_eval_at``-th evaluation or in the given (run folder name, step) of training."""
    counts = {"evals": 0, "steps": {}}

    def counted_evaluate(*args, **kwargs):
        if fail_eval_at is not None and counts["evals"] + 1 == fail_eval_at:
            raise RuntimeError("injected failure in evaluation")
        result = EVALUATE(*args, **kwargs)
        counts["evals"] += 1
        return result

    def counted_step(run, step):
        key = str(Path(run.run_dir).relative_to(Path(run.run_dir).parents[1]))
        if fail_train == (key, step):
            raise RuntimeError("injected failure in training")
        result = TRAIN_STEP(run, step)
        counts["steps"][key] = counts["steps"].get(key, 0) + 1
        return result

    monkeypatch.setattr(runner, "evaluate", counted_evaluate)
    monkeypatch.setattr(loop, "train_step", counted_step)
    return counts


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "eval_seconds"} for r in rows]


def test_a_killed_study_resumes_without_redoing_a_cell(plan_args, tmp_path, monkeypatch, capsys):
    study = load_plan(QUICK, plan_args)
    cells = [c.id for c in study.eval_cells()]
    assert len(cells) == 40 and len(study.train_cells()) == 4

    # uninterrupted, through the command
    straight = tmp_path / "straight"
    assert main(["study", "--plan", str(QUICK), "--out", str(straight), "--no-progress", *plan_args]) == 0
    printed = capsys.readouterr().out
    assert "| elf-reg | reg-off | 16 |" in printed and "| elf | reg-off |" not in printed
    for name in ("plan.json", "results.jsonl", "results.json", "table.md", "pass1_vs_nfe.png"):
        assert (straight / name).stat().st_size > 0
    expected = json.loads((straight / "results.json").read_text())
    assert expected["complete"] and [r["cell"] for r in expected["rows"]] == cells
    assert all(r["n_problems"] == 4 and r["checkpoint_step"] == 4 for r in expected["rows"])

    # the same plan again, stopped twice: in the 11th evaluation (elf-reg/t0 trained, 2 of its cells done) ...
    out = tmp_path / "resumed"
    counts = _counting(monkeypatch, fail_eval_at=11)
    with pytest.raises(RuntimeError, match="injected failure in evaluation"):
        runner.run_study(study, out, progress=False)
    assert len((out / "results.jsonl").read_text().splitlines()) == 10
    done = {c["cell"]: (c["trained"], c["eval_done"]) for c in runner.status(study, out)["training"]}
    assert done == {"elf/t0": (True, 8), "elf-reg/t0": (True, 2), "elf/t1": (False, 0), "elf-reg/t1": (False, 0)}
    # --report prints what is finished so far, marks what is not, and writes nothing
    capsys.readouterr()
    assert main(["study", "--plan", str(QUICK), "--out", str(out), "--report", *plan_args]) == 0
    printed = capsys.readouterr().out
    assert "10 of 40 evaluation cells finished" in printed
    assert "| elf | early-stop | 4 |" in printed and "1 × 2 (incomplete)" in printed
    assert "| elf-reg | reg-off | 16 | n/a |" in printed  # no cell of it yet
    assert not (out / "table.md").exists()
    partial = tmp_path / "partial"
    assert main(["study", "--plan", str(QUICK), "--out", str(out), "--report-to", str(partial), *plan_args]) == 0
    assert not json.loads((partial / "results.json").read_text())["complete"]
    assert "1 × 2 (incomplete)" in (partial / "table.md").read_text() and (partial / "pass1_vs_nfe.png").exists()
    with pytest.raises(ValueError, match="holds no study"):
        runner.report_so_far(study, tmp_path / "empty")
    # ... then in the third step of elf/t1, after its checkpoint at step 2
    first = counts
    counts = _counting(monkeypatch, fail_train=("elf/t1", 2))
    with pytest.raises(RuntimeError, match="injected failure in training"):
        runner.run_study(study, out, progress=False)
    assert counts["steps"] == {"elf/t1": 2} and counts["evals"] == 10
    with open(out / "results.jsonl", "a") as f:
        f.write('{"cell": "elf-reg/t0/early-st')  # a row cut by a kill -9
    second = counts
    counts = _counting(monkeypatch)
    report = runner.run_study(study, out, progress=False)

    # every training step and every evaluation ran exactly once over the three attempts
    steps = {k: first["steps"].get(k, 0) + second["steps"].get(k, 0) + counts["steps"].get(k, 0)
             for k in ("elf/t0", "elf/t1", "elf-reg/t0", "elf-reg/t1")}
    assert steps == {"elf/t0": 4, "elf/t1": 4, "elf-reg/t0": 4, "elf-reg/t1": 4}
    assert first["evals"] + second["evals"] + counts["evals"] == 40
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["cell"] for r in lines) == sorted(cells)
    # each row and each checkpoint says which code made it
    assert all(r["code"] == code_version() for r in lines)
    meta = json.loads((resolve_checkpoint(out / "runs" / "elf" / "t1") / "meta.json").read_text())
    assert meta["code"] == code_version()
    # and the outcome is the uninterrupted run's, row by row and in the table
    assert report["table"] == expected["table"]
    assert _strip(report["rows"]) == _strip(expected["rows"])
    assert (out / "table.md").read_text() == (straight / "table.md").read_text()

    # a finished study runs nothing when asked again
    counts = _counting(monkeypatch)
    runner.run_study(study, out, progress=False)
    assert counts == {"evals": 0, "steps": {}}


def test_a_folder_grows_and_refuses_a_model_trained_otherwise(plan_args, tmp_path, capsys):
    study = load_plan(QUICK, plan_args)
    out = tmp_path / "study"
    runner.claim_folder(study, out)
    (out / "runs" / "elf" / "t0").mkdir(parents=True)
    row = {"cell": "elf/t0/early-stop/nfe4/s0", "sample": asdict(study.sample_config(study.eval_cells()[0]))}
    (out / "results.jsonl").write_text(json.dumps(row) + "\n")
    runner.claim_folder(study, out)  # the same plan: kept as it is
    assert runner.status(study, out)["training"][0]["eval_done"] == 1

    # more evaluation axes and another model: the folder keeps its cells and records the new plan
    grown = load_plan(QUICK, [*plan_args, "sample_seeds=[0, 1, 2]", "models=[elf, elf-reg, repa]"])
    runner.claim_folder(grown, out)
    assert runner.stored_identity(out) == grown.identity() and (out / "runs" / "elf" / "t0").is_dir()
    assert runner.status(grown, out)["training"][0]["eval_done"] == 1
    # the same sampler with other settings (the base's ρ): the old row is not a cell of the new plan
    other_rho = load_plan(QUICK, [*plan_args, "overrides={sample: {rho: 2}}"])
    assert runner.clashes(other_rho, runner.stored_plan(out)) == []
    assert runner.status(other_rho, out)["training"][0]["eval_done"] == 0

    # a folder made before a training setting existed: the setting counts as its default, and so
    # does a section added since (the distill section)
    held = runner.stored_plan(out)
    for model in held["plan"]["models"].values():
        del model["config"]["train"]["host_memory"], model["config"]["distill"]
    assert runner.clashes(other_rho, held) == []
    released = load_plan(QUICK, [*plan_args, "overrides={train: {host_memory: release}}"])
    assert runner.clashes(released, held) == ["elf: train.host_memory", "elf-reg: train.host_memory"]

    # a model trained with other settings is refused in one line, by the command too
    args = ["study", "--plan", str(QUICK), "--out", str(out), "--no-progress", *plan_args,
            "overrides={train: {steps: 3}}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"elfreg study: error: {out} holds models trained with other settings (elf: train.steps; "
                   "elf-reg: train.steps); choose another --out, or pass --overwrite to discard what is there")
    assert (out / "results.jsonl").exists()
    assert main([*args[:1], "--dry-run", *args[1:]]) == 0
    assert "holds models trained with other settings (elf: train.steps" in capsys.readouterr().out
    retrained = load_plan(QUICK, [*plan_args, "overrides={train: {steps: 3}}"])
    runner.claim_folder(retrained, out, overwrite=True)
    assert not (out / "results.jsonl").exists() and not (out / "runs").exists()
    assert runner.stored_identity(out) == retrained.identity()
    with locked(out, what="study folder"), pytest.raises(FolderInUse, match="in use"):
        runner.run_study(retrained, out, progress=False)
    demo = tmp_path / "demo"
    (demo / "elf-reg").mkdir(parents=True)
    (demo / "results.json").write_text("{}")
    with pytest.raises(ValueError, match=f"^{demo} is not a study folder .it holds elf-reg, results.json.; choose"):
        runner.claim_folder(study, demo, overwrite=True)


def test_a_signal_during_evaluation_stops_after_the_cell(plan_args, tmp_path, monkeypatch):
    study = load_plan(QUICK, [*plan_args, "models=[elf]", "train_seeds=[0]", "samplers=[early-stop]", "nfes=[4]"])

    def interrupted_evaluate(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as from `kill`, while the first cell is sampled
        return EVALUATE(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate", interrupted_evaluate)
    with pytest.raises(runner.StudyInterrupted, match="interrupted by SIGTERM after evaluation cell elf/t0/early-stop/"
                                                      "nfe4/s0; run the same command to resume") as err:
        runner.run_study(study, tmp_path / "out", progress=False)
    assert err.value.exit_status == 130
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 1
    counts = _counting(monkeypatch)
    assert runner.run_study(study, tmp_path / "out", progress=False)["complete"]
    assert counts == {"evals": 1, "steps": {}}


def test_a_run_made_outside_the_study_is_adopted_only_if_trained_as_the_plan_trains_it(
        plan_args, tmp_path, monkeypatch, capsys):
    """``--adopt elf-reg/t0 RUN``: a run trained elsewhere with the cell's settings becomes the
    cell (the study finishes its steps and evaluates it; nothing is trained twice); a run trained
    otherwise, a cell the plan lacks, a cell that has a folder and a folder without a checkpoint
    are refused in one line, with nothing written."""
    from elfreg.train.loop import train

    args = [*plan_args, "models=[elf-reg]", "train_seeds=[0]", "samplers=[early-stop]", "nfes=[4]",
            "sample_seeds=[0]"]
    study = load_plan(QUICK, args)
    out, cell = tmp_path / "study", study.train_cells()[0]
    outside = tmp_path / "outside" / "elf-reg"
    train(study.run_config(cell, outside, progress=False), stop_at=2)  # half of the plan's 4 steps
    other_seed = study.run_config(cell, tmp_path / "seed1", progress=False)
    train(replace(other_seed, train=replace(other_seed.train, seed=1)), stop_at=2)
    capsys.readouterr()

    cmd = ["study", "--plan", str(QUICK), "--out", str(out), *args]
    refusals = {
        "elf/t0": "'elf/t0' is not a training cell of this plan (its cells: elf-reg/t0)",
        "elf-reg/t0 " + str(tmp_path / "seed1"): f"{tmp_path / 'seed1'} was not trained as this plan trains "
                                                  "elf-reg/t0 (train.seed: 1 then, 0 now)",
        "elf-reg/t0 " + str(tmp_path): f"{tmp_path} holds no checkpoint (give a run folder)",
    }
    for given, why in refusals.items():
        cell_id, _, source = given.partition(" ")
        assert main([*cmd, "--adopt", cell_id, source or str(outside)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("elfreg study: error: --adopt") and err.endswith(why), err
    assert not (out / "runs").exists()
    with locked(outside), pytest.raises(FolderInUse, match="in use"):
        runner.adopt_run(study, out, "elf-reg/t0", outside)

    # another model width: the first differing key of the model section, both values
    wider = load_plan(QUICK, [*args, "overrides={model: {width: 48}}"])
    with pytest.raises(ValueError, match=r"\(model.width: 32 then, 48 now\)$"):
        runner.adopt_run(wider, tmp_path / "wider", "elf-reg/t0", outside)

    # a cosine run of another length was on another schedule from its first step after warmup
    longer = load_plan(QUICK, [*args, "overrides.train.steps=8"])
    assert longer.models["elf-reg"].train.schedule == "cosine"
    with pytest.raises(ValueError, match=r"\(the cosine schedule's length: 4 then, 8 now \(train.decay_steps: 4 "):
        runner.adopt_run(longer, tmp_path / "longer", "elf-reg/t0", outside)

    assert main([*cmd, "--adopt", "elf-reg/t0", str(outside)]) == 0
    assert "elf-reg/t0           to train  evaluations 0/1" in capsys.readouterr().out  # 2 of 4 steps
    target = out / "runs" / "elf-reg" / "t0"
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == ["latest", "step-0000002"]
    assert not (target / ".lock").exists() and (outside / "checkpoints" / "step-0000002").is_dir()
    assert main([*cmd, "--adopt", "elf-reg/t0", str(outside)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"the study already has {target}; remove it first to replace it")

    counts = _counting(monkeypatch)
    runner.run_study(study, out, progress=False)
    assert counts == {"evals": 1, "steps": {"elf-reg/t0": 2}}  # steps 3 and 4 only
    row, = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["cell"] == "elf-reg/t0/early-stop/nfe4/s0" and row["checkpoint_step"] == 4


def test_jobs_run_training_cells_side_by_side_and_write_the_rows_of_one_process(
        plan_args, tmp_path, monkeypatch, capfd):
    """``--jobs 2``: two training cells at a time, each in a worker process on one torch thread
    (of the parent's two); every row equals the row one process on one thread writes, and the
    folder reads as one made one cell at a time."""
    import torch

    args = [*plan_args, "models=[elf, elf-reg]", "train_seeds=[0]", "samplers=[early-stop]", "nfes=[4]",
            "sample_seeds=[0, 1]"]
    study = load_plan(QUICK, args)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = runner.run_study(study, tmp_path / "one", progress=False)
        torch.set_num_threads(2)
        two = runner.run_study(study, tmp_path / "two", progress=True, jobs=2)
    finally:
        torch.set_num_threads(threads)
    said = capfd.readouterr().err  # the workers' lines too: they write to the same stderr
    assert "done (2 of 2 training cells, 2 at a time)" in said
    assert all(f"[{k}/2] {c.id}: started (worker " in said for k, c in enumerate(study.train_cells(), 1))
    assert two["complete"] and len(two["rows"]) == 4
    assert _strip(two["rows"]) == _strip(one["rows"])  # in the plan's order, whatever order they ended in
    assert two["table"] == one["table"]
    for cell in study.train_cells():
        assert resolve_checkpoint(runner.run_dir(tmp_path / "two", cell)).name == "step-0000004"
    counts = _counting(monkeypatch)  # a finished folder: nothing runs again, in any number of jobs
    assert runner.run_study(study, tmp_path / "two", progress=False, jobs=2)["complete"]
    assert counts == {"evals": 0, "steps": {}}
    assert main(["study", "--plan", str(QUICK), "--out", str(tmp_path / "two"), "--jobs", "0", *args]) == 2
    assert capfd.readouterr().err.strip() == "elfreg study: error: --jobs must be >= 1; got 0"
