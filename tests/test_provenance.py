"""Which code made a result (``elfreg.provenance``): version, commit and dirty state."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import elfreg
from elfreg.provenance import code_version, git_state

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_outside_a_checkout_there_is_no_commit(tmp_path):
    assert git_state(tmp_path) == (None, None)


@needs_git
def test_commit_and_dirty_state_of_a_checkout(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = git("rev-parse", "HEAD").stdout.strip()
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "a.txt").write_text("two\n")
    assert git_state(tmp_path) == (head, True)


def test_code_version_is_the_imported_package():
    code = code_version()
    assert code["version"] == elfreg.__version__
    package = Path(elfreg.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True) \
        if shutil.which("git") else None
    # installed from a checkout: its HEAD, as git itself says; otherwise no commit
    assert code["commit"] == (head.stdout.strip() if head is not None and head.returncode == 0 else None)
    assert code_version() is code  # read once per process
