"""tools/elf_distill_reference.py against an ELF checkout of the branch ``distillation``
(``$ELF_DISTILL_CHECKOUT``; skipped without one): ELF's distillation step at sizes and seeds no
fixture has is recomputed by elfreg within tolerance, and the progressively distilled checkpoint
ELF's code writes imports with its forward and its few-step sampling settings."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elfreg.cli import main
from elfreg.config import Config
from elfreg.interop.elf_distill_parity import check_distill_parity

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = os.environ.get("ELF_DISTILL_CHECKOUT", "")


def _why_skip() -> str | None:
    if not CHECKOUT:
        return ("set ELF_DISTILL_CHECKOUT to an ELF checkout (github lillian039/ELF, branch distillation) to run "
                "ELF's code")
    if importlib.util.find_spec("einops") is None:
        return "ELF's code needs einops (pip install einops)"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))


@pytest.mark.parametrize("sizes", [
    ["--seed", "31", "--depth", "1", "--width", "20", "--heads", "5", "--enc-dim", "6", "--vocab", "11",
     "--bottleneck", "3", "--time-tokens", "1", "--cfg-tokens", "2", "--mode-tokens", "2", "--max-length", "7",
     "--student-steps", "8,1", "--teacher-steps", "2,5"],
    ["--seed", "5", "--depth", "3", "--width", "36", "--heads", "3", "--enc-dim", "10", "--vocab", "29",
     "--bottleneck", "12", "--time-tokens", "3", "--cfg-tokens", "1", "--mode-tokens", "0", "--max-length", "9",
     "--batch", "8", "--student-steps", "2,4", "--teacher-steps", "8,1", "--conditional"],
])
def test_elfs_distillation_at_unseen_sizes_is_recomputed(sizes, tmp_path):
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, str(ROOT / "tools" / "elf_distill_reference.py"), "--elf", CHECKOUT,
                    "--out", str(ref), "--pd-checkpoint", "2", *sizes], check=True, capture_output=True, text=True)
    results = check_distill_parity(ref / "parity.safetensors", ref / "train.yml")
    assert len(results) == 2 and all(r.ok for r in results), [r.line() for r in results]
    out = tmp_path / "imported"
    assert main(["import-elf", "--checkpoint", str(ref / "pd"), "--elf-config", str(ref / "pd" / "config.yml"),
                 "--out", str(out), "--check", str(ref / "pd" / "parity_ema.safetensors")]) == 0
    steps = int(sizes[sizes.index("--student-steps") + 1].split(",")[0])
    sample = Config.load(out / "config.yaml").sample
    assert (sample.sampler, sample.nfe) == ("sde", steps + 1)
    assert json.loads((out / "meta.json").read_text())["imported_from"]["distilled"]["student_steps"] == steps
