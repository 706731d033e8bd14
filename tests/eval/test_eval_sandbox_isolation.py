"""Sandbox isolation policy: the mode choice, the identity of a run, the environment, the reaping."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import pytest

from elfreg.eval.code.sandbox import SandboxLimits, run_in_sandbox, sandbox_isolation
from elfreg.eval.code.sandbox import isolation as policy


def test_fallback_warns_once_and_still_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "_isolation", None)
    monkeypatch.setattr(policy, "_warned", False)
    monkeypatch.setattr(policy, "_probe", lambda mode: "operation not permitted (simulated)")
    monkeypatch.delenv(policy.ISOLATION_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="namespaces are not permitted") as caught:
        assert sandbox_isolation(refresh=True) == "none"
        assert sandbox_isolation(refresh=True) == "none"
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sandbox_isolation() == "none"  # cached, silent
        res = run_in_sandbox("while True:\n    pass\n", timeout=1)
        assert res.status == "timeout" and res.isolation == "none"
        res = run_in_sandbox("x = bytearray(4 << 30)", timeout=10, limits=SandboxLimits(memory_mb=512))
        assert res.status == "memory"
        res = run_in_sandbox("import os; print(sorted(os.environ))", timeout=10)
        assert res.ok and "PYTHONHASHSEED" in res.stdout and "HOME" in res.stdout
        assert "ELFREG" not in res.stdout


def test_forced_mode_that_is_unavailable_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "_isolation", None)
    monkeypatch.setattr(policy, "_probe", lambda mode: "not permitted (simulated)")
    monkeypatch.setenv(policy.ISOLATION_ENV, "userns")
    with pytest.raises(RuntimeError, match="userns"):
        sandbox_isolation(refresh=True)
    monkeypatch.setenv(policy.ISOLATION_ENV, "bogus")
    with pytest.raises(ValueError, match="bogus"):
        sandbox_isolation(refresh=True)



def test_scrubbed_env_is_the_whole_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELFREG_TEST_SECRET", "leak")
    env = policy.scrubbed_env("/tmp/job")
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                        "PYTHONIOENCODING", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    assert env["HOME"] == env["TMPDIR"] == "/tmp/job"
    assert env["PYTHONHASHSEED"] == "0" and env["OMP_NUM_THREADS"] == "1"
    assert "leak" not in env.values()


def test_namespaces_identity_is_a_fresh_throwaway_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "_interp_paths", lambda: (["/home/me"], ["/home/me/venv"]))
    first = policy.run_identity("namespaces", 64)
    second = policy.run_identity("namespaces", 64)
    assert 1_000_000 <= first.uid < 2_000_000_000 and first.gid == first.uid
    assert first.uid != second.uid  # a uid is never shared between runs (2e9 choices)
    settings = first.boot_settings()
    assert settings == {"uid": first.uid, "gid": first.uid, "hide": ["/home/me"], "expose": ["/home/me/venv"],
                        "nproc": 64}


def test_root_identity_without_namespaces_depends_on_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy.os, "geteuid", lambda: 0)
    monkeypatch.setattr(policy, "_interp_paths", lambda: ([], []))
    reachable = policy.run_identity("none", 64)
    assert reachable.uid >= 1_000_000 and not reachable.drop_caps
    assert "hide" not in reachable.boot_settings()  # no mount namespace to hide anything in
    # an interpreter another uid cannot reach: stay uid 0 and drop every capability instead
    monkeypatch.setattr(policy, "_interp_paths", lambda: (["/root"], ["/root/venv"]))
    stuck = policy.run_identity("none", 64)
    assert stuck.uid == -1 and stuck.drop_caps
    assert stuck.boot_settings() == {"drop_caps": "1", "nproc": 64}
    # root in a user namespace is mapped to itself; the kernel ignores RLIMIT_NPROC for uid 0
    assert policy.run_identity("userns", 64).boot_settings() == {"nproc": 64}


def test_unprivileged_nproc_counts_the_callers_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy.os, "geteuid", lambda: 4321)
    monkeypatch.setattr(policy, "user_tasks", lambda uid: 37 if uid == 4321 else 0)
    for mode in ("userns", "none"):
        identity = policy.run_identity(mode, 64)
        assert identity.uid == -1 and identity.nproc == 64 + 37, mode


@pytest.fixture
def open_dir():
    """A folder every uid may traverse (pytest's own temporary folders are private)."""
    path = Path(tempfile.mkdtemp(prefix="elfreg-isolation-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def test_hidden_ancestors_and_exposed_interpreter_paths(open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private = open_dir / "home"
    prefix = private / "venv"
    site_dir = prefix / "lib" / "site-packages"
    site_dir.mkdir(parents=True)
    os.chmod(private, 0o700)  # another uid cannot traverse it
    monkeypatch.setattr(policy.sys, "prefix", str(prefix))
    monkeypatch.setattr(policy.sys, "base_prefix", str(prefix))
    monkeypatch.setattr(policy, "python", lambda: str(prefix / "bin" / "python"))
    monkeypatch.setattr(policy, "site_dirs", lambda: [str(site_dir)])
    hidden, exposed = policy._hidden_and_exposed()
    assert str(private) in hidden
    # the site-packages inside the prefix come along with the prefix's bind mount
    assert str(prefix) in exposed and str(site_dir) not in exposed


def test_reaping_happens_only_for_a_throwaway_uid_without_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[int] = []
    monkeypatch.setattr(policy, "kill_uid", killed.append)
    policy.RunIdentity("none", 1_234_567, 1_234_567, 64).reap()
    policy.RunIdentity("none", -1, -1, 64, drop_caps=True).reap()
    policy.RunIdentity("namespaces", 7_654_321, 7_654_321, 64).reap()  # the PID namespace ends them
    assert killed == [1_234_567]


def test_user_tasks_counts_threads_of_a_uid() -> None:
    mine = policy.user_tasks(os.geteuid())
    assert mine >= 1  # this process at least
    assert policy.user_tasks(1_999_999_999) == 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("sleep") is None, reason="starting processes as another uid")
def test_kill_uid_ends_every_process_of_that_uid() -> None:
    uid = policy._throwaway_id()
    procs = [subprocess.Popen([shutil.which("sleep"), "60"], user=uid, group=uid, start_new_session=True)
             for _ in range(3)]
    try:
        assert policy.user_tasks(uid) == 3
        policy.kill_uid(uid)
        assert [p.wait(timeout=120) for p in procs] == [-9, -9, -9]
        assert policy.user_tasks(uid) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
