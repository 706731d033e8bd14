"""The sandbox contains hostile programs; the evaluator, host files and processes survive."""

from __future__ import annotations

import ast
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from elfreg.eval.code.sandbox import SandboxJob, SandboxLimits, run_in_sandbox, run_many, sandbox_isolation
from elfreg.eval.code.sandbox import isolation as policy

ISOLATED = sandbox_isolation() in ("namespaces", "userns")
needs_namespaces = pytest.mark.skipif(
    not ISOLATED, reason="Linux namespaces unavailable here: no file-system/network/PID isolation to test"
)


def _all_gone(marker: str, patience: float = 120) -> bool:
    """Whether every host process carrying ``marker`` exits (waiting for the kernel to reap them, up
    to ``patience`` seconds: a bound against hanging, not a speed the test asks for)."""
    deadline = time.monotonic() + patience
    while _marker_processes(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _marker_processes(marker: str) -> list[int]:
    """Host processes whose command line contains ``marker``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_normal_program_output_args_and_files() -> None:
    res = run_in_sandbox(
        "import sys, os\nprint('hello', sys.argv[1:])\nprint(open('data.txt').read())\nprint(os.getcwd())",
        timeout=10, files={"data.txt": "payload"}, args=["a", "b"],
    )
    assert res.ok, res
    assert "hello ['a', 'b']" in res.stdout and "payload" in res.stdout
    assert res.returncode == 0 and res.isolation == sandbox_isolation()


def test_exception_is_error_with_reason() -> None:
    res = run_in_sandbox("raise ValueError('boom')", timeout=10)
    assert res.status == "error" and res.reason == "ValueError: boom"


def test_infinite_loop_times_out() -> None:
    res = run_in_sandbox("while True:\n    pass\n", timeout=1.0)
    assert res.status == "timeout" and "limit" in res.reason


def test_sleep_times_out_on_wall_clock() -> None:
    res = run_in_sandbox("import time\ntime.sleep(60)\n", timeout=1.0)
    assert res.status == "timeout" and "wall-clock" in res.reason


def test_memory_bomb_hits_address_space_limit() -> None:
    limits = SandboxLimits(memory_mb=512)
    res = run_in_sandbox("x = bytearray(4 << 30)\n", timeout=10, limits=limits)
    assert res.status == "memory" and "512 MiB" in res.reason
    res = run_in_sandbox("xs = []\nwhile True:\n    xs.append(' ' * (1 << 24))\n", timeout=20, limits=limits)
    assert res.status == "memory"


def test_printing_gigabytes_is_cut_off() -> None:
    limits = SandboxLimits(max_output_bytes=1 << 20)
    res = run_in_sandbox("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", timeout=30, limits=limits)
    assert res.status == "output_limit"
    assert len(res.stdout) <= 1 << 20


def test_environment_is_scrubbed_and_parent_secret_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "elfreg-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("ELFREG_TEST_SECRET", secret)
    program = textwrap.dedent(
        f"""
        import os
        print(sorted(os.environ))
        print(dict(os.environ))
        for pid in ['self', '1', '{os.getpid()}', '{os.getppid()}'] + os.listdir('/proc'):
            try:
                print(pid, open(f'/proc/{{pid}}/environ', 'rb').read())
            except OSError as err:
                print(pid, 'blocked', type(err).__name__)
        print('DONE')
        """
    )
    res = run_in_sandbox(program, timeout=10)
    assert "DONE" in res.stdout
    assert secret not in res.stdout and secret not in res.stderr
    assert "ELFREG_TEST_SECRET" not in res.stdout
    assert "PYTHONHASHSEED" in res.stdout


@pytest.fixture
def sentinels(tmp_path: Path):
    """World-writable sentinel files in /tmp and (if present) /var/tmp."""
    dirs = [tmp_path]
    if os.path.isdir("/var/tmp") and os.access("/var/tmp", os.W_OK):
        dirs.append(Path(tempfile.mkdtemp(prefix="elfreg-sentinel-", dir="/var/tmp")))
    files = []
    for d in dirs:
        os.chmod(d, 0o777)
        f = d / "sentinel.txt"
        f.write_text("original")
        os.chmod(f, 0o666)
        files.append(f)
    yield files
    for d in dirs[1:]:
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


@needs_namespaces
def test_writing_and_deleting_files_outside_the_work_dir_is_prevented(sentinels: list[Path]) -> None:
    targets = [str(f) for f in sentinels] + ["/etc/elfreg-sandbox-probe", os.path.join(os.getcwd(), "probe.txt")]
    program = textwrap.dedent(
        f"""
        import os, shutil
        for path in {targets!r}:
            for action in ('write', 'delete', 'rmtree'):
                try:
                    if action == 'write':
                        open(path, 'w').write('pwned')
                    elif action == 'delete':
                        os.remove(path)
                    else:
                        shutil.rmtree(os.path.dirname(path))
                    print('SUCCEEDED', action, path)
                except OSError as err:
                    print('blocked', action, path, type(err).__name__)
        open('mine.txt', 'w').write('ok')
        print('cwd-write', open('mine.txt').read(), os.getcwd())
        """
    )
    res = run_in_sandbox(program, timeout=20)
    assert res.ok, res
    assert "SUCCEEDED" not in res.stdout
    assert res.stdout.count("blocked") == 3 * len(targets)
    assert "cwd-write ok" in res.stdout  # the work directory itself is writable
    for f in sentinels:
        assert f.read_text() == "original"
    assert not os.path.exists("/etc/elfreg-sandbox-probe")
    assert not os.path.exists(os.path.join(os.getcwd(), "probe.txt"))


@needs_namespaces
def test_network_is_unreachable() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    program = textwrap.dedent(
        f"""
        import socket
        for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('8.8.8.8', 53)]:
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(addr)
                print('CONNECTED', addr)
            except OSError as err:
                print('blocked', addr, err.errno)
        """
    )
    try:
        res = run_in_sandbox(program, timeout=20)
        assert res.ok, res
        assert "CONNECTED" not in res.stdout and res.stdout.count("blocked") == 3
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


@needs_namespaces
def test_killing_the_parent_and_other_processes_fails() -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        program = textwrap.dedent(
            f"""
            import os, signal
            print('visible', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), flush=True)
            for pid in (os.getppid(), 1, {os.getpid()}, {victim.pid}, -1):
                try:
                    os.kill(pid, signal.SIGKILL)
                    print('sent', pid, flush=True)
                except OSError as err:
                    print('blocked', pid, type(err).__name__, flush=True)
            os.killpg(0, signal.SIGKILL)  # its own process group: only itself dies
            """
        )
        res = run_in_sandbox(program, timeout=10)
        assert res.status == "killed", res
        # the refusal is the evidence: a kill that had been sent would read "sent", not "blocked"
        assert victim.poll() is None, "a host process was killed"
        assert f"blocked {victim.pid}" in res.stdout and f"blocked {os.getpid()}" in res.stdout
        # the program sees only its own PID namespace: init and itself
        visible = next(ln for ln in res.stdout.splitlines() if ln.startswith("visible"))
        assert ast.literal_eval(visible.split(" ", 1)[1]) == [1, 2]
    finally:
        victim.kill()
        victim.wait()


@needs_namespaces
def test_fork_bomb_is_contained_and_leaves_no_process() -> None:
    marker = "forkbomb-" + secrets.token_hex(6)
    limits = SandboxLimits(nproc=32)
    counting = textwrap.dedent(
        """
        import os, time
        n = 0
        for _ in range(100000):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            n += 1
        print('forked', n, flush=True)
        time.sleep(60)
        """
    )
    res = run_in_sandbox(counting, timeout=3, args=[marker], limits=limits)
    assert res.status == "timeout"
    # The kernel never applies RLIMIT_NPROC to the host's root user: a root caller whose
    # interpreter forces the user-namespace mode (uid 0 mapped to itself) is bounded only by the
    # time limit and the PID namespace, which the rest of this test checks.
    if not (res.isolation == "userns" and os.geteuid() == 0):
        assert res.stdout.startswith("forked"), res
        forked = int(res.stdout.split()[1])
        assert 0 < forked < 32  # RLIMIT_NPROC stopped it
    exponential = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    res = run_in_sandbox(exponential, timeout=3, args=[marker], limits=limits)
    assert res.status == "timeout"
    assert _all_gone(marker)  # thousands of killed processes take a while to reap


@needs_namespaces
def test_daemon_children_do_not_survive() -> None:
    marker = "daemon-" + secrets.token_hex(6)
    program = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        print('parent done')
        """
    )
    res = run_in_sandbox(program, timeout=5, args=[marker])
    assert res.ok and "parent done" in res.stdout
    assert _all_gone(marker)


def test_dying_workers_do_not_lose_other_results() -> None:
    jobs = [
        SandboxJob("print('a')", 10),
        SandboxJob("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 10),
        SandboxJob("import ctypes\nctypes.string_at(0)\n", 10),
        SandboxJob("print('b')", 10),
        SandboxJob("print('never')", 10, files={"../escape": "x"}),  # rejected by the evaluator
        SandboxJob("import os\nos._exit(3)\n", 10),
    ]
    results = run_many(jobs, workers=3)
    assert [r.status for r in results] == ["ok", "killed", "killed", "ok", "sandbox_error", "error"]
    assert results[0].stdout.strip() == "a" and results[3].stdout.strip() == "b"
    assert "SIGKILL" in results[1].reason and "SIGSEGV" in results[2].reason
    assert "bad sandbox file name" in results[4].reason
    assert results[5].returncode == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="exercising user namespaces as root")
def test_userns_mode_also_isolates(monkeypatch: pytest.MonkeyPatch, sentinels: list[Path]) -> None:
    if policy._probe("userns") is not None:
        pytest.skip("user namespaces not permitted here")
    monkeypatch.setattr(policy, "_isolation", "userns")
    program = textwrap.dedent(
        f"""
        import os, socket
        try:
            open({str(sentinels[-1])!r}, 'w').write('pwned'); print('WROTE')
        except OSError as err:
            print('blocked write', type(err).__name__)
        try:
            socket.create_connection(('1.1.1.1', 80), timeout=2); print('CONNECTED')
        except OSError:
            print('blocked net')
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print('remount', libc.mount(None, b'/', None, 32 | 4096, None))  # try to undo the read-only remount
        print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])
        """
    )
    res = run_in_sandbox(program, timeout=20)
    assert res.ok, res
    assert "WROTE" not in res.stdout and "CONNECTED" not in res.stdout
    assert "remount -1" in res.stdout
    assert "0000000000000000" in res.stdout  # no effective capabilities
    assert sentinels[-1].read_text() == "original"


def test_program_ignoring_signals_still_ends_at_the_timeout() -> None:
    program = "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n" \
              "    signal.signal(s, signal.SIG_IGN)\ntime.sleep(30)\n"
    res = run_in_sandbox(program, timeout=1)
    assert res.status == "timeout"


def test_program_closing_its_outputs_is_waited_for() -> None:
    done = run_in_sandbox("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(0.5)\n", timeout=10)
    assert done.status == "ok" and done.duration >= 0.5
    hung = run_in_sandbox("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n", timeout=1)
    assert hung.status == "timeout"
