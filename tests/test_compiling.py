"""torch.compile's two machine questions: can it run here (one line when not, before any step),
and one Inductor kernel cache per CPU capability."""

from __future__ import annotations

import pytest
import torch

from elfreg.compiling import CACHE_ENV, CompileUnavailable, compile_problem, require_compile, use_capability_cache


@pytest.fixture
def fresh_probe():
    compile_problem.cache_clear()
    yield
    compile_problem.cache_clear()


def test_the_kernel_cache_gets_the_capability_unless_the_caller_chose_a_folder(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability = torch.backends.cpu.get_cpu_capability().lower()
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert use_capability_cache(tmp_path / "k") == tmp_path / f"k-{capability}"
    monkeypatch.setenv(CACHE_ENV, default_cache_dir())  # what importing torch may fill in
    assert str(use_capability_cache()) == f"{default_cache_dir()}-{capability}"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert use_capability_cache(tmp_path / "k") == tmp_path / "mine"


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
