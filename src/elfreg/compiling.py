"""``torch.compile`` on this machine: whether it runs here, and where its kernels are kept.

What the training room (``train.compile``) and the sampler (``compile=True``) share:

- On a CPU, Inductor builds its kernels with the machine's C++ compiler. Without a working one
  the first compiled call fails deep inside a training step or a sampling call;
  :func:`compile_problem` says so up front, in one line, from one tiny compiled function per
  process.
- Inductor's on-disk kernel cache does not record which CPU capability its kernels were built
  for: a process whose kernels were held to AVX2 (``ATEN_CPU_CAPABILITY=avx2``) after one with
  AVX-512 reused the AVX-512 kernels, and the compiled network returned values near 1e35.
  :func:`use_capability_cache` keeps one cache per capability, also for child processes that
  inherit the folder of a parent with another capability.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
KEYED_BASE_ENV = "ELFREG_INDUCTOR_CACHE_BASE"
"""Set beside ``$TORCHINDUCTOR_CACHE_DIR`` when elfreg keyed the folder: ``<this>-<capability>``
is then elfreg's own, and a process of another capability (a child that inherited both) re-keys it."""


class CompileUnavailable(RuntimeError):
    """``torch.compile`` was asked for and cannot run here (:func:`compile_problem` says why)."""


def use_capability_cache(base: str | os.PathLike | None = None) -> Path:
    """Point Inductor's kernel cache at a folder of this CPU capability's own,
    ``<base>-<capability>`` (``base``: Inductor's default folder), unless ``$TORCHINDUCTOR_CACHE_DIR``
    already names a folder the caller chose (other than Inductor's default, which importing torch
    may fill in); a folder keyed by an earlier call, here or in a parent process
    (:data:`KEYED_BASE_ENV`), gets this process's capability. Returns the folder now in use.
    Call it before the first compile of the process."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    current, keyed = os.environ.get(CACHE_ENV), os.environ.get(KEYED_BASE_ENV)
    if keyed and current is not None and current.startswith(f"{keyed}-"):
        root = keyed
    elif current in (None, default):
        root = os.path.abspath(base) if base is not None else default
    else:
        return Path(current)
    capability = torch.backends.cpu.get_cpu_capability().lower()
    os.environ[KEYED_BASE_ENV] = root
    os.environ[CACHE_ENV] = f"{root}-{capability}"
    return Path(os.environ[CACHE_ENV])


def _probe(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + x.sum()


@functools.cache
def compile_problem() -> str | None:
    """Why ``torch.compile`` cannot run on this machine's CPU (one line), or None when a tiny
    compiled function ran here and returned what eager returns. Asked once per process (the
    first call takes a few seconds; :func:`use_capability_cache` is applied first)."""
    use_capability_cache()
    x = torch.linspace(-2.0, 2.0, 37)
    try:
        got = torch.compile(_probe, dynamic=False)(x)
    except Exception as err:  # noqa: BLE001 - any failure means the same thing here: no compile
        first = next((line for line in str(err).splitlines() if line.strip()), "")
        return f"{type(err).__name__}: {first.strip()}"[:300]
    if not torch.allclose(got, _probe(x), rtol=1e-5, atol=1e-5):
        return "a compiled test function returned wrong values (a stale kernel cache?)"
    return None


def require_compile(setting: str) -> None:
    """Raise :class:`CompileUnavailable` naming ``setting`` (what asked for compiling, e.g.
    ``train.compile``) when :func:`compile_problem` finds one."""
    problem = compile_problem()
    if problem is not None:
        raise CompileUnavailable(f"{setting} needs torch.compile, which cannot run here ({problem}): "
                                 f"install a C++ compiler, or run without {setting}")
