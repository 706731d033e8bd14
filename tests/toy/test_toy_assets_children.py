"""A toy-asset build's builder processes never outlive it: SIGTERM stops them and removes the
build's temporary folder, and the process still ends by the signal; a failing builder stops the
other; a build killed outright leaves builders that exit by themselves, and a folder the next
build (of any settings) removes. The build says what it builds, each LM's steps as it goes with
the time left, and how long it took. The builders here run stand-ins for pretraining
(``builder_fakes``), so that they start in a fraction of a second."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import builder_fakes
import pytest

from elfreg.toy import assets as toy_assets
from elfreg.toy import lm as toy_lm
from elfreg.toy.builders import LMJob, Progress, duration, run_side_by_side

HERE = Path(__file__).resolve().parent
SHORT = toy_lm.ToyLMConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                           steps=3, batch_size=4, lr=1e-3, warmup_steps=1)
proc_fs = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds child processes through /proc")

# a whole build_toy_assets whose two LMs take a step each and then train for ever
ASSET_BUILD = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(HERE)!r})
    import builder_fakes
    from dataclasses import replace
    from elfreg.toy import assets, lm
    assets._build_lm = builder_fakes.steps_then_waits
    encoder = lm.ToyLMConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                             steps=1000, batch_size=4, lr=1e-3, warmup_steps=1)
    assets.build_toy_assets(sys.argv[1], quick=True, encoder=encoder, teacher=replace(encoder, seed=1),
                            corpus_size=50, progress=False, side_by_side=True,
                            say=lambda line: print(line, flush=True), every=0.05)
""")
# the builders alone, as a build runs them
BUILDERS = textwrap.dedent(f"""
    import multiprocessing, sys
    sys.path.insert(0, {str(HERE)!r})
    import builder_fakes
    from elfreg.toy.builders import LMJob, Progress, run_side_by_side, signals_stop_the_build
    jobs = [LMJob("encoder", 1000, ()), LMJob("teacher", 1000, ())]
    with signals_stop_the_build(), Progress(jobs, lambda line: print(line, flush=True), 0.05,
                                            multiprocessing.get_context("spawn")) as progress:
        run_side_by_side(builder_fakes.steps_then_waits, jobs, 1, progress)
""")


def _builders(pid: int) -> list[int]:
    """The spawned worker processes whose parent is ``pid`` (not multiprocessing's resource
    tracker, which ends on its own once its parent is gone)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:  # it ended while we looked
            continue
        if int(fields[1]) == pid and b"spawn_main" in command:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a parent that does not reap it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _once_both_train(script: str, *args: str) -> tuple[subprocess.Popen, list[str], list[int]]:
    """Start ``script``; return once both of its LMs have taken a step: the process, the lines
    it printed, and its two builders."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        steps = re.match(r"toy LMs: encoder (\d+)/1000 steps, teacher (\d+)/1000 steps; .* so far", line)
        if steps and all(int(n) > 0 for n in steps.groups()):
            break
    else:
        raise AssertionError(f"the build ended before both LMs trained: {lines[-3:]}")
    builders = _builders(proc.pid)
    assert len(builders) == 2, builders
    return proc, lines, builders


def _temporary(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "toy_assets").iterdir() if p.name.startswith(".tmp-"))


@proc_fs
def test_sigterm_stops_the_builders_removes_the_temporary_folder_and_still_ends_the_process(tmp_path):
    proc, lines, builders = _once_both_train(ASSET_BUILD, str(tmp_path))
    assert lines[0].startswith("building the toy tokenizer and LMs (first use, cached after") and \
        str(tmp_path) in lines[0]
    assert "about" in lines[-1] and lines[-1].endswith("left")  # both started: the time left is estimated
    assert len(_temporary(tmp_path)) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == -signal.SIGTERM  # it still ends by the signal
    assert not any(_running(pid) for pid in builders)  # stopped and reaped before it ended
    assert _temporary(tmp_path) == []


@proc_fs
def test_builders_of_a_process_killed_outright_exit_by_themselves():
    proc, _, builders = _once_both_train(BUILDERS)
    proc.kill()  # no clean-up can run
    proc.wait(120)
    deadline = time.monotonic() + 120
    while any(_running(pid) for pid in builders):  # they see their parent's pipe close
        assert time.monotonic() < deadline, "the builders outlived their killed parent"
        time.sleep(0.05)


def test_a_failing_builder_stops_the_other_and_reports_come_back_in_order():
    context = multiprocessing.get_context("spawn")
    jobs = [LMJob("encoder", 5, ("encoder", 5)), LMJob("teacher", 3, ("teacher", 3))]
    with Progress(jobs, None, 1.0, context) as progress:
        reports = run_side_by_side(builder_fakes.steps, jobs, 1, progress)
    assert [r["name"] for r in reports] == ["encoder", "teacher"]
    assert [len(r["threads"]) for r in reports] == [5, 3] and [d.value for d in progress.done] == [5, 3]
    with Progress(jobs, None, 1.0, context) as progress:
        with pytest.raises(RuntimeError, match="pretraining the toy teacher failed: ValueError: no such corpus"):
            run_side_by_side(builder_fakes.by_name, [LMJob("encoder", 9, ("wait",)), LMJob("teacher", 9, ("fail",))],
                             1, progress)
    assert multiprocessing.active_children() == []  # the waiting builder was stopped and reaped


def test_a_build_says_what_it_builds_and_how_long_it_took_and_removes_dead_builds_folders(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    base = tmp_path / "toy_assets"
    stale = base / f".tmp-0123456789abcdef-{dead.pid}-abcd1234"  # another build's, its process gone
    alive = base / f".tmp-0123456789abcdef-{os.getpid()}-abcd1234"  # a build still running
    for folder in (stale, alive):
        (folder / "encoder").mkdir(parents=True)
    lines: list[str] = []
    settings = dict(quick=True, encoder=SHORT, teacher=replace(SHORT, seed=1), corpus_size=50, progress=False,
                    side_by_side=False, say=lines.append)
    built = toy_assets.build_toy_assets(tmp_path, **settings)
    assert _temporary(tmp_path) == [alive.name]
    assert lines[0].startswith("building the toy tokenizer and LMs (first use, cached after")
    assert lines[0].endswith(f"into {built.root}")
    assert re.fullmatch(r"built the toy tokenizer and LMs in \d+ (min \d\d )?s", lines[-1])
    lines.clear()
    assert toy_assets.build_toy_assets(tmp_path, **settings).reused and lines == []  # a reused build is silent


def test_progress_counts_steps_and_estimates_the_time_left():
    jobs = [LMJob("encoder", 100, ()), LMJob("teacher", 400, ())]
    progress = Progress(jobs, None, 1.0, multiprocessing.get_context("spawn"))
    assert progress.line().startswith("toy LMs: encoder 0/100 steps, teacher 0/400 steps; ")
    assert "left" not in progress.line()  # no rate to go by before every LM has started
    progress._began -= 60  # a minute in: the encoder half done, the teacher a tenth
    progress.done[0].value, progress.done[1].value = 50, 40
    assert progress.line() == "toy LMs: encoder 50/100 steps, teacher 40/400 steps; 1 min 00 s so far, " \
        "about 9 min 00 s left"
    assert duration(42.4) == "42 s" and duration(185) == "3 min 05 s"
