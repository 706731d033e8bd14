"""Run folders: locks, identities (claim, resume, overwrite) and graceful interrupts."""

from __future__ import annotations

import json
import os
import signal

import pytest

from elfreg.runs import (
    FolderInUse,
    FolderKind,
    GracefulInterrupt,
    RunFolderError,
    claimed,
    first_difference,
    locked,
    value_at,
    write_json_atomic,
)
from lock_holder import held_lock


def test_a_second_process_is_refused_and_a_killed_holder_releases_the_lock(tmp_path):
    folder = tmp_path / "run"
    with held_lock(folder) as holder:  # killed with SIGKILL at the end: the kernel drops the lock
        with pytest.raises(FolderInUse, match=rf"in use by another elfreg process \(pid {holder.pid}\)"):
            with locked(folder):
                pass
    with locked(folder):
        assert (folder / ".lock").read_text().strip() == str(os.getpid())
    with locked(folder):  # released at the end of the block, so it can be taken again
        pass


def test_first_signal_sets_a_flag_and_the_second_interrupts():
    # raise_signal runs this thread's Python handler before it returns: nothing to wait for
    with GracefulInterrupt() as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


def test_a_folder_created_and_left_empty_is_removed_and_nothing_else_is(tmp_path):
    fresh = tmp_path / "a" / "run"
    with pytest.raises(RuntimeError), locked(fresh):
        raise RuntimeError("failed before writing anything")
    assert not fresh.exists()
    kept = tmp_path / "kept"
    with pytest.raises(RuntimeError), locked(kept):
        (kept / "metrics.jsonl").write_text("{}\n")
        raise RuntimeError("failed after writing")
    assert (kept / "metrics.jsonl").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    with locked(existing):
        pass
    assert existing.is_dir()  # it was there before: never removed


KIND = FolderKind(job="job", identity_file="id.json", outputs=("rows.jsonl", "table.txt", "id.json"))


def test_first_difference_names_the_first_differing_dotted_key():
    assert first_difference({"a": 1, "s": {"nfe": 64, "rho": 8}}, {"a": 1, "s": {"nfe": 64, "rho": 4}}) == "s.rho"
    assert first_difference({"a": 1}, {"a": 1, "b": None}) == "b"  # a key added, even with a null value
    assert first_difference({"a": 1, "gone": 2}, {"a": 1}) == "gone"
    assert first_difference({"a": [1]}, {"a": [1]}) is None
    assert value_at({"s": {"nfe": 8}}, "s.nfe") == 8 and value_at({"s": 1}, "s.nfe") == "(absent)"


def test_a_claimed_folder_resumes_its_own_job_and_refuses_another_in_one_line(tmp_path):
    out = tmp_path / "out"
    with claimed(out, {"seed": 0, "s": {"nfe": 8}}, KIND) as resumed:
        assert not resumed
        (out / "rows.jsonl").write_text("{}\n")
    assert json.loads((out / "id.json").read_text()) == {"seed": 0, "s": {"nfe": 8}}
    with claimed(out, {"seed": 0, "s": {"nfe": 8}}, KIND) as resumed:
        assert resumed
    with pytest.raises(RunFolderError) as err:
        with claimed(out, {"seed": 0, "s": {"nfe": 16}}, KIND):
            pass
    assert str(err.value) == (f"output folder {out} holds another job (s.nfe: 8 there, 16 now); rerun with "
                              "--overwrite to replace its results, or choose another --out")
    assert (out / "rows.jsonl").read_text() == "{}\n"  # nothing was lost


def test_overwrite_removes_only_the_kinds_files_and_an_identity_without_results_is_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "rows.jsonl").write_text("{}\n")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="holds results of an earlier job \\(rows.jsonl\\) but no id.json"):
        with claimed(out, {"seed": 1}, KIND):
            pass
    with claimed(out, {"seed": 1}, KIND, overwrite=True) as resumed:
        assert not resumed and not (out / "rows.jsonl").exists()
    assert (out / "notes.txt").read_text() == "mine"
    with claimed(out, {"seed": 2}, KIND) as resumed:  # no results under seed 1: no refusal
        assert not resumed
    assert json.loads((out / "id.json").read_text()) == {"seed": 2}


def test_an_unwritable_folder_fails_before_the_job(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(RunFolderError, match=r"output folder .*file/out is not writable \(Not a directory\)"):
        with claimed(tmp_path / "file" / "out", {}, KIND):
            raise AssertionError("the job must not start")


def test_write_json_atomic_replaces_the_file_whole(tmp_path):
    path = tmp_path / "a.json"
    write_json_atomic(path, {"x": "é"})
    write_json_atomic(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2} and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
