"""The output folder's identity, checks and lock: a used ``--out`` is resumed only by the same
evaluation, another one is refused (or replaced with ``--overwrite``), an unusable folder fails
before any work, and a second evaluation into a held folder is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from eval_fakes import FakeGenerator, eval_main, fake_checkpoint, gsm8k_file

from elfreg.eval import generation
from elfreg.eval.reporting import EVAL_FOLDER
from lock_holder import held_lock


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``run(out, *flags) -> (exit status, generator)``: 4 problems × 2 samples from a fake checkpoint."""
    data, ckpt = gsm8k_file(tmp_path / "gsm8k.jsonl", 4), fake_checkpoint(tmp_path / "ckpt")

    def go(out: Path, *extra: str) -> tuple[int, FakeGenerator]:
        gen = FakeGenerator()
        monkeypatch.setattr(generation, "_generate", gen)
        rc = eval_main(["--task", "gsm8k", "--source", str(data), "--checkpoint", str(ckpt), "--samples", "2",
                    "--out", str(out), "--no-progress", *extra])
        return rc, gen
    return go


def _seeds(out: Path) -> list[int]:
    return [json.loads(line)["seed"] for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_the_same_evaluation_resumes_and_another_is_refused_with_the_first_differing_key(
        run, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert run(out)[0] == 0
    before = (out / "predictions.jsonl").read_bytes()
    rc, gen = run(out)  # the same command: everything is there, nothing is generated
    assert rc == 0 and gen.calls == [] and (out / "predictions.jsonl").read_bytes() == before
    capsys.readouterr()
    for flags, key, there, now in ((["--seed", "1"], "seed", "0", "1"), (["--nfe", "8"], "sample.nfe", "64", "8"),
                                   (["--limit", "2"], "limit", "null", "2")):
        rc, gen = run(out, *flags)
        err = capsys.readouterr().err.splitlines()
        assert rc == 2 and gen.calls == [] and len(err) == 1, flags
        assert err[0] == (f"elfreg eval: error: output folder {out} holds another evaluation ({key}: {there} there, "
                          f"{now} now); rerun with --overwrite to replace its results, or choose another --out")
        assert (out / "predictions.jsonl").read_bytes() == before


def test_overwrite_removes_only_what_elfreg_wrote(run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(out)[0] == 0
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "summary.json").write_text("{}")  # not a sweep folder: kept
    rc, gen = run(out, "--seed", "5", "--overwrite")
    assert rc == 0 and len(gen.calls) == 1
    assert _seeds(out) == [5, 6] * 4
    assert json.loads((out / "eval_config.json").read_text())["seed"] == 5
    assert (out / "notes.txt").read_text() == "mine" and (out / "mine" / "summary.json").read_text() == "{}"


def test_results_without_an_identity_are_refused(run, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "old"
    out.mkdir()
    (out / "predictions.jsonl").write_text('{"task_id": "gsm8k/0", "solution": "#### 1", "seed": 0}\n')
    rc, gen = run(out)
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and gen.calls == [] and len(err) == 1
    assert f"output folder {out} holds results of an earlier evaluation (predictions.jsonl) but no eval_config.json" \
        in err[0]
    assert run(out, "--overwrite")[0] == 0 and _seeds(out) == [0, 1] * 4


def test_sweep_points_resume_on_their_own_and_overwrite_clears_the_sweep(run, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sweep"
    assert run(out, "--nfes", "8,16")[0] == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["nfe16", "nfe8"]
    assert json.loads((out / "nfe8" / "eval_config.json").read_text())["sample"]["nfe"] == 8
    rc, gen = run(out, "--nfes", "8,32")  # nfe8 is resumed (nothing to do), nfe32 is new
    assert rc == 0 and len(gen.calls) == 1 and (out / "nfe32" / "summary.json").exists()
    capsys.readouterr()
    rc, gen = run(out, "--nfes", "8,16", "--seed", "3")
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and gen.calls == [] and len(err) == 1 and f"{out / 'nfe8'} holds another evaluation (seed:" in err[0]
    rc, gen = run(out, "--nfes", "8,16", "--seed", "3", "--overwrite")
    assert rc == 0 and sorted(p.name for p in out.iterdir() if p.is_dir()) == ["nfe16", "nfe8"]  # nfe32 is gone
    assert _seeds(out / "nfe8") == [3, 4] * 4


def test_clear_outputs_names_what_it_removed(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "full-span-nfe16").mkdir()
    (tmp_path / "full-span-nfe16" / "table.txt").write_text("t")
    (tmp_path / "full-span-nfe16" / "keep.txt").write_text("k")
    (tmp_path / "nfe8").mkdir()
    (tmp_path / "nfe8" / "predictions.jsonl").write_text("")
    removed = sorted(EVAL_FOLDER.clear(tmp_path))
    assert removed == ["full-span-nfe16/table.txt", "nfe8/predictions.jsonl", "summary.json"]
    assert (tmp_path / "full-span-nfe16" / "keep.txt").exists() and not (tmp_path / "nfe8").exists()


def test_predictions_scoring_has_an_identity_too(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = gsm8k_file(tmp_path / "gsm8k.jsonl", 2)
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"task_id": "gsm8k/0", "solution": "#### 1"}\n{"task_id": "gsm8k/1", "solution": "#### 5"}\n')
    out = tmp_path / "out"
    argv = ["--task", "gsm8k", "--source", str(data), "--predictions", str(preds), "--out", str(out), "--no-progress"]
    assert eval_main(argv) == 0 and eval_main(argv) == 0  # the same scoring again replaces its own results
    identity = json.loads((out / "eval_config.json").read_text())
    assert identity["predictions"] == str(preds.resolve()) and len(identity["sha256"]) == 64
    capsys.readouterr()
    assert eval_main([*argv, "--timeout", "3"]) == 2
    assert "(timeout: 10.0 there, 3.0 now)" in capsys.readouterr().err
    preds.write_text('{"task_id": "gsm8k/0", "solution": "#### 1"}\n')
    assert eval_main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"output folder {out} holds another evaluation (sha256:" in err[0]
    assert eval_main([*argv, "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["n_samples"] == 1


def test_an_out_that_cannot_be_created_fails_before_anything_is_generated(run, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, gen = run(blocker / "out")  # its parent is a regular file: cannot be created, even by root
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and gen.calls == [] and err == [
        f"elfreg eval: error: output folder {blocker / 'out'} is not writable (Not a directory)"]


def test_a_read_only_out_fails_before_anything_is_generated(run, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    locked_dir = tmp_path / "read-only"
    locked_dir.mkdir()
    locked_dir.chmod(0o555)
    try:
        if os.access(locked_dir, os.W_OK):
            pytest.skip("running as root: permission bits do not stop writes")
        rc, gen = run(locked_dir)
        err = capsys.readouterr().err.splitlines()
        assert rc == 2 and gen.calls == [] and len(err) == 1 and f"output folder {locked_dir} is not writable" in err[0]
    finally:
        locked_dir.chmod(0o755)


def test_a_second_evaluation_into_a_held_folder_is_refused(run, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    with held_lock(out, what="evaluation folder") as holder:
        rc, gen = run(out)
        err = capsys.readouterr().err.splitlines()
        assert rc == 2 and gen.calls == [] and len(err) == 1
        assert f"evaluation folder {out} is in use by another elfreg process (pid {holder.pid})" in err[0]
        assert not (out / "predictions.jsonl").exists() and not (out / "eval_config.json").exists()
    assert run(out)[0] == 0  # the kernel dropped the dead holder's lock
    assert not [p for p in out.iterdir() if p.name.startswith(".elfreg-probe")]


def test_the_identity_is_written_before_generating_and_a_folder_without_results_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt, out = fake_checkpoint(tmp_path / "ckpt"), tmp_path / "out"
    argv = ["--task", "gsm8k", "--checkpoint", str(ckpt), "--samples", "1", "--out", str(out), "--no-progress"]
    # the data is missing: the run fails after claiming the folder, leaving only its identity
    assert eval_main([*argv, "--source", str(tmp_path / "missing.jsonl")]) == 2
    assert sorted(p.name for p in out.iterdir()) == [".lock", "eval_config.json"]
    seen = []
    gen = FakeGenerator(on_call=lambda n: seen.append(json.loads((out / "eval_config.json").read_text())))
    monkeypatch.setattr(generation, "_generate", gen)
    data = gsm8k_file(tmp_path / "gsm8k.jsonl", 2)
    assert eval_main([*argv, "--source", str(data)]) == 0  # another source, but nothing to mix with: accepted
    assert seen[0]["source"] == str(data) and seen[0]["checkpoint"] == str(ckpt.resolve())
    assert set(seen[0]) == {"kind", "task", "source", "data_dir", "template", "checkpoint", "sample", "samples",
                            "seed", "limit", "precision"}


def test_a_run_folder_whose_latest_checkpoint_moved_on_is_another_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "train-run" / "checkpoints"
    fake_checkpoint(runs / "step-0000002")
    monkeypatch.setattr(generation, "_generate", FakeGenerator())
    out = tmp_path / "out"
    argv = ["--task", "gsm8k", "--source", str(gsm8k_file(tmp_path / "gsm8k.jsonl", 2)), "--checkpoint",
            str(tmp_path / "train-run"), "--samples", "1", "--out", str(out), "--no-progress"]
    assert eval_main(argv) == 0
    fake_checkpoint(runs / "step-0000004")  # training went on: the same path names other weights
    capsys.readouterr()
    assert eval_main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f'(checkpoint: "{(runs / "step-0000002").resolve()}" there, ' \
        f'"{(runs / "step-0000004").resolve()}" now)' in err[0]
