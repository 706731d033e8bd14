"""tools/elf_reference.py against an ELF checkout (``$ELF_CHECKOUT``; skipped without one): files
made by ELF's code at sizes no fixture has pass ``import-elf --check`` for both weights, and its
sampler traces (the Euler step and the SDE step, given ELF's noise) are followed call by call."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from elfreg.cli import main

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = os.environ.get("ELF_CHECKOUT", "")


def _why_skip() -> str | None:
    if not CHECKOUT:
        return "set ELF_CHECKOUT to an ELF checkout (github lillian039/ELF, branch pytorch_elf) to run ELF's code"
    if importlib.util.find_spec("einops") is None:
        return "ELF's code needs einops (pip install einops)"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))


@pytest.mark.parametrize("sizes", [
    ["--seed", "23", "--depth", "1", "--width", "20", "--heads", "5", "--enc-dim", "6", "--vocab", "11",
     "--bottleneck", "3", "--time-tokens", "1", "--cfg-tokens", "0", "--mode-tokens", "2", "--max-length", "7"],
    ["--seed", "5", "--depth", "4", "--width", "36", "--heads", "3", "--enc-dim", "10", "--vocab", "29",
     "--bottleneck", "12", "--time-tokens", "3", "--cfg-tokens", "1", "--mode-tokens", "0", "--max-length", "9",
     "--conditional"],
])
def test_elfs_own_files_at_unseen_sizes_pass_the_check(sizes, tmp_path):
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, str(ROOT / "tools" / "elf_reference.py"), "--elf", CHECKOUT, "--out", str(ref),
                    *sizes], check=True, capture_output=True, text=True)
    params, ema = (load_file(str(ref / f"parity_{w}.safetensors")) for w in ("params", "ema"))
    assert params.keys() == ema.keys() and {"0.x", "0.t", "0.output", "0.decoder_logits"} <= params.keys()
    assert params["1.x"].shape[-1] == int(sizes[sizes.index("--enc-dim") + 1])  # the C-wide case
    assert not torch.allclose(params["0.output"], ema["0.output"]) and params["0.output"].abs().max() > 0
    for weights in ("params", "ema"):
        assert main(["import-elf", "--checkpoint", str(ref), "--elf-config", str(ref / "train.yml"),
                     "--out", str(tmp_path / weights), "--weights", weights,
                     "--check", str(ref / f"parity_{weights}.safetensors")]) == 0
    # the traces are of the params weights: Euler (and prompt CFG 2) and the SDE step at two seeds
    assert main(["import-elf", "--checkpoint", str(ref), "--elf-config", str(ref / "train.yml"),
                 "--out", str(tmp_path / "traced"), "--weights", "params",
                 "--check", str(ref / "sampler.safetensors"), "--check", str(ref / "sampler_sde.safetensors")]) == 0
