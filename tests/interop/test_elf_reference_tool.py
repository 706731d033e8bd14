"""The reference tools against ELF checkouts (each test skipped without its checkout).

tools/elf_reference.py (``$ELF_CHECKOUT``, branch ``pytorch_elf``): files made by ELF's code at
sizes no fixture has pass ``import-elf --check`` for both weights, and its sampler traces (the
Euler step and the SDE step, given ELF's noise) are followed call by call.
tools/elf_distill_reference.py (``$ELF_DISTILL_CHECKOUT``, branch ``distillation``): ELF's
distillation step at sizes and seeds no fixture has is recomputed by elfreg within tolerance, and
the progressively distilled checkpoint ELF's code writes imports with its forward and its
few-step sampling settings."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from elfreg.cli import main
from elfreg.config import Config
from elfreg.interop.elf_distill_parity import check_distill_parity

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = os.environ.get("ELF_CHECKOUT", "")
DISTILL_CHECKOUT = os.environ.get("ELF_DISTILL_CHECKOUT", "")


def needs_checkout(variable: str, branch: str) -> pytest.MarkDecorator:
    """Skip unless ``$variable`` names an ELF checkout of ``branch`` and einops is installed."""
    why = None
    if not os.environ.get(variable):
        why = f"set {variable} to an ELF checkout (github lillian039/ELF, branch {branch}) to run ELF's code"
    elif importlib.util.find_spec("einops") is None:
        why = "ELF's code needs einops (pip install einops)"
    return pytest.mark.skipif(why is not None, reason=str(why))


@needs_checkout("ELF_CHECKOUT", "pytorch_elf")
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


@needs_checkout("ELF_DISTILL_CHECKOUT", "distillation")
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
    subprocess.run([sys.executable, str(ROOT / "tools" / "elf_distill_reference.py"), "--elf", DISTILL_CHECKOUT,
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
