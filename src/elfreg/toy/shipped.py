"""The toy LMs elfreg ships: the default toy build (tokenizer, encoder, teacher) kept in the
package, so that ``elfreg demo`` starts training at once and every CPU reads the same frozen models.

Why: building them takes about 3 of a 2-core CPU's 16 demo minutes, and CPUs round alike only
when they run alike kernels: from the same settings and seeds, a build under AVX2 kernels and one
under AVX-512 kernels are two different pairs of LMs (teacher greedy 69.7 against 66.1 % on the
one-step test problems, encoder digit readout 88.5 against 75.4 %), so the student a newcomer
trained depended on the CPU before training began.

The shipped build sits in ``shipped/<quick|full>-<hash>/``, named as a cache build is (the hash of
every setting), with ``shipped.json``: how it was made and the SHA-256 of every file.
:func:`elfreg.toy.assets.build_toy_assets` returns it for those settings instead of building,
after checking every file against its SHA-256 (a changed file refuses in one line), unless
``ELFREG_TOY_LMS=build`` is set or ``shipped=False`` is passed. Any other settings (the quick
build, a study's own LMs) are built and cached as before. A change to the default settings
changes the hash, and the shipped build is then no longer used: a test fails until it is remade
with ``python -m elfreg.toy.shipped`` (builds the default LMs under this process's kernels,
reusing a matching build in the cache, and makes it the one shipped build).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from elfreg.provenance import code_version, file_sha256

SHIPPED_DIR = Path(__file__).parent / "shipped"
"""Where the package keeps its shipped toy builds."""
SHIP_ENV = "ELFREG_TOY_LMS"
"""``ELFREG_TOY_LMS=build``: build the toy LMs here even where a shipped build matches."""
PROVENANCE = "shipped.json"


class ShippedAssetsDamaged(RuntimeError):
    """A file of a shipped toy build is missing or differs from its recorded SHA-256."""


def shipped_wanted() -> bool:
    """False when ``ELFREG_TOY_LMS=build`` asks for a build here; any other value is refused."""
    value = os.environ.get(SHIP_ENV, "")
    if value not in ("", "build", "shipped"):
        raise ValueError(f"{SHIP_ENV} must be 'build' or 'shipped' (the default), got {value!r}")
    return value != "build"


def _cpu_model() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != PROVENANCE)


def find_shipped(name: str, shipped_dir: Path | None = None) -> Path | None:
    """The shipped build folder ``name`` (``full-<hash>``), checked file by file, or None when
    the package ships no build of that name. Raises :class:`ShippedAssetsDamaged` when a file
    is missing, added or changed."""
    root = (shipped_dir or SHIPPED_DIR) / name
    if not (root / PROVENANCE).is_file():
        return None
    recorded = json.loads((root / PROVENANCE).read_text())["sha256"]
    present = {p.relative_to(root).as_posix(): p for p in _files(root)}
    if set(present) != set(recorded):
        missing, extra = sorted(set(recorded) - set(present)), sorted(set(present) - set(recorded))
        raise ShippedAssetsDamaged(f"shipped toy build {root} does not hold the files it lists (missing {missing}, "
                                   f"extra {extra}): reinstall elfreg, or set {SHIP_ENV}=build")
    for rel, path in present.items():
        if file_sha256(path) != recorded[rel]:
            raise ShippedAssetsDamaged(f"shipped toy build file {path} differs from its recorded SHA-256: "
                                       f"reinstall elfreg, or set {SHIP_ENV}=build")
    return root


def provenance(root: Path) -> dict | None:
    """``shipped.json`` of a shipped build, without its checksums (when, where and under which
    kernels it was made); None for a build made here."""
    path = root / PROVENANCE
    if not path.is_file():
        return None
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "sha256"}


def ship(build_root: Path, shipped_dir: Path | None = None, note: str = "") -> Path:
    """Copy the complete build ``build_root`` into the shipped folder (replacing a shipped build
    of the same name) with its ``shipped.json``; returns the shipped folder. The kernels recorded
    are this process's (:func:`torch.backends.cpu.get_cpu_capability`): ship a build from the
    process, or the kernels, that made it."""
    dest = (shipped_dir or SHIPPED_DIR) / build_root.name
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(build_root, tmp)
    record = {"settings_hash": build_root.name.split("-", 1)[1], "shipped": time.strftime("%Y-%m-%d"),
              "kernels": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
              "cpu": _cpu_model(), "code": code_version(), "note": note,
              "sha256": {p.relative_to(tmp).as_posix(): file_sha256(p) for p in _files(tmp)}}
    (tmp / PROVENANCE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    """Build the default toy LMs here (or reuse the cache's build of the same settings) and ship
    them as the package's one shipped build, removing builds of other settings:
    ``python -m elfreg.toy.shipped [--note TEXT]``."""
    import argparse

    from elfreg.toy.assets import build_toy_assets

    parser = argparse.ArgumentParser(prog="python -m elfreg.toy.shipped", description=main.__doc__)
    parser.add_argument("--note", default="", help="a line kept in shipped.json (e.g. how the kernels were set)")
    args = parser.parse_args(argv)
    assets = build_toy_assets(shipped=False, progress=sys.stderr.isatty())
    dest = ship(assets.root, note=args.note)
    for old in SHIPPED_DIR.iterdir():  # the package ships the default build alone
        if old.is_dir() and old != dest:
            shutil.rmtree(old)
            print(f"removed the shipped build of other settings, {old.name}")
    print(f"shipped {assets.root} ({'reused from the cache' if assets.reused else 'built now'}) as {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
