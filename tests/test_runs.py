"""Run-folder locks and graceful interrupts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from elfreg.runs import FolderInUse, GracefulInterrupt, locked

HOLD = textwrap.dedent("""
    import sys, time
    from elfreg.runs import locked
    with locked(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
""")


def test_a_second_process_is_refused_and_a_killed_holder_releases_the_lock(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"in use by another elfreg process \(pid {holder.pid}\)"):
            with locked(folder):
                pass
    finally:
        holder.kill()  # kill -9: the kernel drops the lock
        holder.wait()
    with locked(folder):
        assert (folder / ".lock").read_text().strip() == str(os.getpid())
    with locked(folder):  # released at the end of the block, so it can be taken again
        pass


def test_first_signal_sets_a_flag_and_the_second_interrupts():
    with GracefulInterrupt() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.requested and stop.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
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
