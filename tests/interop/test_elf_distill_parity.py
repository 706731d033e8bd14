"""elfreg's progressive distillation against ELF's own ``distill_train_step`` (files in
tests/interop/fixtures/elf_distill, made by tools/elf_distill_reference.py): the teacher's target
and the self-conditioning input, the loss and its parts, and the whole objective from ELF's draws,
at two network sizes and two batch seeds each, unconditional and conditional; a reference moved
by 1e-2 fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from elfreg.interop.elf_distill_parity import check_distill_parity, read_distill_parity

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "elf_distill"
SETS = {"uncond": [(2, 4), (1, 1)], "cond": [(4, 2), (2, 3)]}  # (student steps N, teacher steps K) per case


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_case_of_elfs_distillation_step_is_recomputed(name):
    folder = FIXTURES / name
    networks, cases, meta = read_distill_parity(folder / "parity.safetensors")
    assert [(round(1 / float(meta[f"{i}.pd_step_size"])), int(meta[f"{i}.pd_teacher_steps"])) for i in cases] == \
        SETS[name]
    assert len({meta[f"{i}.seed"] for i in cases}) == len(cases)  # a seed per case
    for case in cases.values():  # every branch of ELF's step is in the case
        decode = case["decoder_mask"] > 0
        assert decode.any() and (~decode).any() and case["l2_loss"] > 0.01 and case["ce_loss"] > 0.01
        assert not torch.allclose(case["target"][~decode], case["z_t_s"][~decode])
    assert not all(torch.equal(networks["teacher"][k], networks["student"][k]) for k in networks["teacher"])
    results = check_distill_parity(folder / "parity.safetensors", folder / "train.yml")
    assert all(r.ok for r in results), [r.line() for r in results]
    checked = {k for r in results for k in r.differences}
    assert {"target", "self_cond", "loss", "ce_loss", "l2_loss"} <= checked
    if name == "uncond":  # the whole objective from ELF's draws (no prompt for a decode row to differ on)
        assert {"objective.loss", "objective.ce_loss", "objective.l2_loss"} <= checked


@pytest.mark.parametrize("key, check", [("target", "target"), ("sc_half", "self_cond"), ("loss", "loss"),
                                        ("l2_loss", "objective.l2_loss")])
def test_a_reference_moved_by_a_hundredth_fails(key, check, tmp_path):
    folder = FIXTURES / "uncond"
    tensors = load_file(str(folder / "parity.safetensors"))
    with safe_open(str(folder / "parity.safetensors"), "pt") as f:
        meta = f.metadata()
    case = tensors[f"0.{key}"].clone()
    if case.dim() == 0:
        case += 1e-2
    else:  # an answer position of a self-conditioned distillation row, where every reference is read
        row = int(((tensors["0.sc_half"][:, -1].abs().amax(1) > 0) & (tensors["0.decoder_mask"] == 0)).nonzero()[0])
        case[row, -1, 0] += 1e-2
    tensors[f"0.{key}"] = case
    moved = tmp_path / "moved.safetensors"
    save_file(tensors, str(moved), metadata=meta)
    first, second = check_distill_parity(moved, folder / "train.yml")
    assert not first.ok and second.ok
    assert first.differences[check] > first.limits[check] and first.differences[check] < 1.5e-2


def test_a_file_that_is_not_a_distillation_parity_file_is_named(tmp_path):
    elf = Path(__file__).resolve().parent / "fixtures" / "elf" / "uncond"
    with pytest.raises(ValueError, match="not a distillation parity file"):
        read_distill_parity(elf / "parity_params.safetensors")
    tensors = load_file(str(FIXTURES / "cond" / "parity.safetensors"))
    del tensors["1.target"]
    meta = {"0.pd_step_size": "0.25", "0.pd_teacher_steps": "2", "1.pd_step_size": "0.5", "1.pd_teacher_steps": "3"}
    save_file(tensors, str(tmp_path / "cut.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="case 1 lacks target"):
        read_distill_parity(tmp_path / "cut.safetensors")
