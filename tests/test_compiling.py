"""torch.compile's two machine questions: can it run here (one line when not, before any step),
and one Inductor kernel cache per CPU capability."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from elfreg.compiling import (
    CACHE_ENV,
    KEYED_BASE_ENV,
    CompileUnavailable,
    compile_problem,
    require_compile,
    use_capability_cache,
)

CAPABILITY = torch.backends.cpu.get_cpu_capability().lower()


@pytest.fixture
def fresh_probe():
    compile_problem.cache_clear()
    yield
    compile_problem.cache_clear()


def test_the_kernel_cache_gets_the_capability_unless_the_caller_chose_a_folder(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv(KEYED_BASE_ENV, raising=False)
    assert use_capability_cache(tmp_path / "k") == tmp_path / f"k-{CAPABILITY}"
    assert use_capability_cache(tmp_path / "other") == tmp_path / f"k-{CAPABILITY}"  # keyed already: kept
    monkeypatch.setenv(CACHE_ENV, default_cache_dir())  # what importing torch may fill in
    assert str(use_capability_cache()) == f"{default_cache_dir()}-{CAPABILITY}"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert use_capability_cache(tmp_path / "k") == tmp_path / "mine"


def _childs_cache(capability: str) -> str:
    """The kernel folder a child process held to ``capability`` chooses, with this one's environment."""
    code = "from elfreg.compiling import use_capability_cache; print(use_capability_cache())"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_child_held_to_another_capability_does_not_read_this_ones_kernels(monkeypatch, tmp_path):
    """A child inherits the keyed folder in its environment; held to another capability (as the
    demo's AVX2 timings are) it must key its own, not reuse this process's kernels."""
    if CAPABILITY == "default":
        pytest.skip("this CPU has no vector capability to hold a child below")
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv(KEYED_BASE_ENV, raising=False)
    assert use_capability_cache(tmp_path / "k") == tmp_path / f"k-{CAPABILITY}"
    assert _childs_cache("default") == str(tmp_path / "k-default")
    assert _childs_cache(CAPABILITY) == str(tmp_path / f"k-{CAPABILITY}")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))  # a folder the caller chose stays theirs
    assert _childs_cache("default") == str(tmp_path / "mine")


def test_a_compile_that_fails_is_named_in_one_line(monkeypatch, fresh_probe):
    def broken(*args, **kwargs):
        raise RuntimeError("\nInvalidCxxCompiler: No working C++ compiler found\n  long traceback")

    monkeypatch.setattr(torch, "compile", broken)
    assert compile_problem() == "RuntimeError: InvalidCxxCompiler: No working C++ compiler found"
    with pytest.raises(CompileUnavailable, match=r"^train.compile needs torch.compile, which cannot run here "
                                                 r"\(RuntimeError: InvalidCxxCompiler.*: install a C\+\+ compiler, "
                                                 r"or run without train.compile$"):
        require_compile("train.compile")


def test_a_compile_that_returns_wrong_values_is_a_problem(monkeypatch, fresh_probe):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (lambda x: fn(x) + 1e35))
    assert "wrong values" in compile_problem()
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    compile_problem.cache_clear()
    assert compile_problem() is None
    require_compile("train.compile")  # no problem, no error


def test_the_demo_trains_eager_and_says_so_where_compile_cannot_run(monkeypatch):
    from elfreg.toy import demo

    cfg = demo.demo_config()
    assert cfg.train.compile
    monkeypatch.setattr(demo, "compile_problem", lambda: "InvalidCxxCompiler: none here")
    with pytest.warns(UserWarning, match=r"cannot run here \(InvalidCxxCompiler: none here\).*train.compile=false"):
        eager = demo.compile_where_possible(cfg)
    changed = {k for k, v in eager.to_dict()["train"].items() if cfg.to_dict()["train"][k] != v}
    assert changed == {"compile"} and not eager.train.compile
    monkeypatch.setattr(demo, "compile_problem", lambda: None)
    assert demo.compile_where_possible(cfg) is cfg
