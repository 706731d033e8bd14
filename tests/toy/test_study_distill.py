"""A study that distils: the plan's ``distill`` section read strictly, its cells and their sample
settings, and the runner on the tiny test LMs (2 training steps, rounds of 2 then 1 steps on 4
held-out problems): the rounds it writes, a teacher's cell equal to the main grid's at the same
sampler, NFE and seed, the table, a resume that redoes nothing, and a changed distillation refused
or discarded alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import elfreg.toy.study.runner as runner
from elfreg.checkpoint import open_checkpoint
from elfreg.cli import main
from elfreg.config import ConfigError
from elfreg.toy.study.plan import load_plan
from elfreg.toy.study.report import format_table

from conftest import tiny_config

DISTILL = {"distill": {"student_steps": [2, 1], "teacher_steps": [2, 2], "round_sampling": "sample"},
           "sample": {"sampler": "full-span", "full_span_grid": "uniform"},
           "train": {"steps": 2, "batch_size": 4, "optimizer": "adamw", "lr": 1e-3, "schedule": "constant",
                     "warmup_steps": 1, "ckpt_every": 2, "log_every": 1, "out_dir": "ignored/by/the/study"}}


def write_plan(folder: Path, base: dict, **changes) -> Path:
    plan = {"base": base, "models": ["elf", "elf-reg"], "train_seeds": [0], "samplers": ["early-stop"],
            "nfes": [3], "sample_seeds": [0],
            "distill": {"config": "distill.yaml", "models": ["elf-reg"], "samplers": ["round", "early-stop"]}}
    plan.update(changes)
    (folder / "distill.yaml").write_text(yaml.safe_dump(DISTILL))
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


@pytest.fixture
def base(tiny_assets, tmp_path) -> dict:
    cfg = tiny_config(tiny_assets, tmp_path, data={"toy_count": 64}, eval={"limit": 4},
                      train={"steps": 2, "ckpt_every": 2}).to_dict()
    for key in ("out_dir", "progress", "seed"):
        cfg["train"].pop(key)
    return cfg


def test_distilled_cells_and_their_sample_settings(tmp_path):
    study = load_plan(write_plan(tmp_path, {}))
    assert study.distill_steps == [2, 1]
    assert [c.id for c in study.distilled_cells()] == [
        "elf-reg/t0/teacher/round/nfe3/s0", "elf-reg/t0/teacher/early-stop/nfe3/s0",
        "elf-reg/t0/distilled-2step/round/nfe3/s0", "elf-reg/t0/distilled-2step/early-stop/nfe3/s0",
        "elf-reg/t0/teacher/round/nfe2/s0", "elf-reg/t0/teacher/early-stop/nfe2/s0",
        "elf-reg/t0/distilled-1step/round/nfe2/s0", "elf-reg/t0/distilled-1step/early-stop/nfe2/s0"]
    cells = {c.id: c for c in study.distilled_cells()}
    main_cell = next(c for c in study.eval_cells() if c.id == "elf-reg/t0/early-stop/nfe3/s0")
    # a named sampler is the main grid's at that NFE, for the teacher and the student alike
    for who in ("teacher", "distilled-2step"):
        assert study.distilled_sample_config(cells[f"elf-reg/t0/{who}/early-stop/nfe3/s0"]) == \
            study.sample_config(main_cell)
    # round: the distillation's own sample section at N + 1 NFE
    round_sample = study.distilled_sample_config(cells["elf-reg/t0/teacher/round/nfe2/s0"])
    assert (round_sample.sampler, round_sample.full_span_grid, round_sample.nfe) == ("full-span", "uniform", 2)
    elf_pd = load_plan(write_plan(tmp_path, {}), ["distill.overrides={distill.round_sampling: elf-pd}"])
    assert elf_pd.distilled_sample_config(cells["elf-reg/t0/teacher/round/nfe2/s0"]).sampler == "sde"
    # the distillation of a cell writes under the folder given, with the cell's seed
    cfg = study.distill_config(study.train_cells()[1], tmp_path / "d", progress=False)
    assert (cfg.train.out_dir, cfg.train.seed, cfg.train.steps) == (str(tmp_path / "d"), 0, 2)
    assert cfg.model == study.models["elf-reg"].model and cfg.text == study.models["elf-reg"].text


def test_the_distill_section_is_read_strictly_and_keeps_other_plans_identities(tmp_path):
    plan = write_plan(tmp_path, {})
    with_distill = load_plan(plan)
    without = load_plan(plan, ["distill={}"])
    assert without.distill is None and without.distilled_cells() == []
    assert "distill" not in without.to_dict() and without.identity() != with_distill.identity()
    # the plan records the distillation without the settings the study sets per cell
    assert "out_dir" not in with_distill.to_dict()["distill"]["config"]["train"]
    assert load_plan(plan, ["distill.overrides={train.out_dir: elsewhere}"]).identity() == with_distill.identity()
    assert load_plan(plan, ["distill.overrides={train.lr: 0.01}"]).identity() != with_distill.identity()
    bad = {
        "distill.models=[repa]": "distill.models[0]: 'repa' is not one of the plan's models",
        "distill.samplers=[round,nope]": "distill.samplers[1]: unknown sampler 'nope'",
        "distill.samplers=[round,round]": "distill.samplers: must list at least one, each once",
        "distill.overrides={distill.student_steps: [2, 2]}": "lists a count twice",
        "distill.overrides={model.width: 8}": "distill.config (for elf-reg): model: a distilled student is its teacher",
        "distill.colour=red": "distill.colour: unknown key",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            load_plan(plan, [override])


def _counting(monkeypatch):
    counts = {"evals": 0, "rounds": 0}
    evaluate, distill = runner.evaluate, runner._distil

    def counted_evaluate(*args, **kwargs):
        counts["evals"] += 1
        return evaluate(*args, **kwargs)

    def counted_distil(*args, **kwargs):
        counts["rounds"] += 1
        return distill(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate", counted_evaluate)
    monkeypatch.setattr(runner, "_distil", counted_distil)
    return counts


def test_a_study_distils_scores_beside_the_teacher_and_resumes(base, tmp_path, monkeypatch, capsys):
    plan = write_plan(tmp_path, base)
    study = load_plan(plan)
    out = tmp_path / "study"
    counts = _counting(monkeypatch)
    report = runner.run_study(study, out, progress=False)
    assert counts == {"evals": 2 + 8, "rounds": 1} and report["complete"]
    for k, n in ((1, 2), (2, 1)):
        ckpt = open_checkpoint(out / "distill" / "elf-reg" / "t0" / f"round{k}-{n}step")
        assert ckpt.meta["step"] == 2 and ckpt.meta["distilled"]["student_steps"] == n
        teacher = Path(ckpt.meta["distilled"]["teacher"])  # the run's newest checkpoint
        assert teacher.parents[1] == (out / "runs" / "elf-reg" / "t0").resolve()
    assert not (out / "distill" / "elf").exists()
    rows = {r["cell"]: r for r in map(json.loads, (out / "distilled.jsonl").read_text().splitlines())}
    assert list(rows) == [c.id for c in study.distilled_cells()]
    assert {r["checkpoint_step"] for r in rows.values()} == {2}
    assert rows["elf-reg/t0/distilled-1step/round/nfe2/s0"]["steps"] == 1
    # the teacher at the main grid's sampler, NFE and sampling seed is the main grid's cell again
    main_rows = {r["cell"]: r for r in report["rows"]}
    same = rows["elf-reg/t0/teacher/early-stop/nfe3/s0"], main_rows["elf-reg/t0/early-stop/nfe3/s0"]
    assert (same[0]["pass@1"], same[0]["token_match"]) == (same[1]["pass@1"], same[1]["token_match"])
    assert same[0]["sample"] == same[1]["sample"]
    # the table pairs each student with its teacher at the same NFE and sampler
    entries = {(e["student"], e["steps"], e["sampler"]): e for e in report["distilled"]}
    assert len(entries) == 8 and all(e["n_train_seeds"] == 1 and e["complete"] for e in entries.values())
    assert entries[("distilled", 2, "round")]["pass@1"] == rows["elf-reg/t0/distilled-2step/round/nfe3/s0"]["pass@1"]
    table = format_table(report)
    student, teacher = entries[("distilled", 1, "round")], entries[("teacher", 1, "round")]
    gap = f"{100 * (student['pass@1'] - teacher['pass@1']):+.1f}"
    assert f"| elf-reg | 1 | 2 | round | {100 * teacher['pass@1']:.1f} (± n/a) | " \
           f"{100 * student['pass@1']:.1f} (± n/a) | {gap} | 1 × 1 |" in table
    assert json.loads((out / "results.json").read_text())["distilled_rows"] == list(rows.values())

    # the same command again redoes nothing; a lost row is scored again, nothing else
    counts = _counting(monkeypatch)
    runner.run_study(study, out, progress=False)
    assert counts == {"evals": 0, "rounds": 0}
    lines = (out / "distilled.jsonl").read_text().splitlines()
    (out / "distilled.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # cut by a kill
    runner.run_study(study, out, progress=False)
    assert counts == {"evals": 1, "rounds": 1}  # the rounds are found finished, not trained again
    again = json.loads((out / "distilled.jsonl").read_text().splitlines()[-1])
    assert {**again, "eval_seconds": None} == {**json.loads(lines[-1]), "eval_seconds": None}

    # the dry run counts the distilled cells
    capsys.readouterr()
    assert main(["study", "--plan", str(plan), "--out", str(out), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "distilled: elf-reg into 2, 1-step students" in printed and "distilled 8/8" in printed

    # another distillation in the same folder: refused, or with --overwrite its students alone discarded
    changed = load_plan(plan, ["distill.overrides={train.lr: 0.002}"])
    with pytest.raises(ValueError, match=r"students distilled with other settings \(distill: train.lr\)"):
        runner.run_study(changed, out, progress=False)
    with pytest.raises(ValueError, match="distilled with other settings"):
        runner.report_so_far(changed, out)
    trained = open_checkpoint(out / "runs" / "elf-reg" / "t0").meta["step"]
    counts = _counting(monkeypatch)
    report = runner.run_study(changed, out, overwrite=True, progress=False)
    assert counts == {"evals": 8, "rounds": 1} and report["complete"]
    assert open_checkpoint(out / "runs" / "elf-reg" / "t0").meta["step"] == trained
    assert len(report["rows"]) == 2 and len(report["distilled_rows"]) == 8
