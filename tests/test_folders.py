"""Folders written whole or not at all (elfreg.folders): a complete folder appears under its name
at once, a failure of any kind leaves nothing but what was there, an existing folder is never
written over; the checkpoint, export, import and toy-asset writers all go through it."""

from __future__ import annotations

import pytest

from elfreg.folders import written_whole


def _siblings(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_complete_folder_appears_at_once_under_its_name(tmp_path):
    final = tmp_path / "out" / "release"
    with written_whole(final) as tmp:
        assert tmp.parent == final.parent and tmp.name.startswith(".tmp-release-") and not final.exists()
        (tmp / "a.txt").write_text("a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b")
    assert (final / "a.txt").read_text() == "a" and (final / "sub" / "b.txt").read_text() == "b"
    assert _siblings(final.parent) == ["release"]


@pytest.mark.parametrize("stop", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failure_of_any_kind_leaves_nothing(tmp_path, stop):
    final = tmp_path / "release"
    with pytest.raises(type(stop)), written_whole(final) as tmp:
        (tmp / "half.txt").write_text("half")
        raise stop
    assert _siblings(tmp_path) == []


def test_an_existing_folder_is_never_written_over(tmp_path):
    final = tmp_path / "release"
    final.mkdir()
    with pytest.raises(FileExistsError, match="already exists"), written_whole(final):
        pass
    with pytest.raises(FileExistsError, match="already exists"), written_whole(tmp_path / "late") as tmp:
        (tmp / "x").write_text("x")
        (tmp_path / "late").mkdir()  # made by another process meanwhile: rename would replace it
    assert _siblings(tmp_path) == ["late", "release"] and not any((tmp_path / "late").iterdir())
