"""``elfreg import-elf`` refuses what it cannot convert in one line naming the fault, exit status
2, and writes nothing: tensors missing, extra or mis-shaped (by ELF's names), a file that is not
an ELF checkpoint, a training YAML that is not valid, not a mapping or has a setting of the wrong
kind, and EMA weights asked of a checkpoint without them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from elfreg.cli import main

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "elf" / "cond"
WEIGHTS = ("params", "ema_params1")
Payload = dict


def _payload() -> Payload:
    return torch.load(FIXTURE / "checkpoint_1000", weights_only=True)


def _in_both(change: Callable[[dict], None]) -> Callable[[Payload], Payload]:
    """A change made to the weights and to their EMA alike."""
    def changed(payload: Payload) -> Payload:
        for key in WEIGHTS:
            change(payload[key])
        return payload
    return changed


def _import(tmp_path: Path, capsys, payload: Payload | bytes, yaml_text: str | None = None,
            *flags: str) -> tuple[int, list[str], Path]:
    """Run the command on ``payload`` (written as ELF writes it, or these bytes) and a training YAML
    (the fixture's unless given); returns (status, stderr lines, --out)."""
    folder = tmp_path / "elf"
    folder.mkdir()
    if isinstance(payload, bytes):
        (folder / "checkpoint_1000").write_bytes(payload)
    else:
        torch.save(payload, folder / "checkpoint_1000")
    (folder / "train.yml").write_text((FIXTURE / "train.yml").read_text() if yaml_text is None else yaml_text)
    out = tmp_path / "imported"
    status = main(["import-elf", "--checkpoint", str(folder), "--elf-config", str(folder / "train.yml"),
                   "--out", str(out), *flags])
    return status, capsys.readouterr().err.splitlines(), out


def _dropped(name: str):
    return _in_both(lambda tensors: tensors.pop(name))


def _added(name: str, value: torch.Tensor):
    return _in_both(lambda tensors: tensors.__setitem__(name, value))


def _reshaped(name: str, rows: int):
    return _in_both(lambda tensors: tensors.__setitem__(name, torch.zeros(rows, *tensors[name].shape[1:])))


CASES = {
    "a block's tensor missing": (_dropped("blocks.1.mlp.w3.weight"),
                                 "the checkpoint's 'ema_params1' lack blocks.1.mlp.w3.weight, which an ELF network "
                                 "of its sizes has"),
    "a tensor the sizes are read from missing": (_dropped("unembed_kernel"),
                                                 "not an ELF network: no tensor 'unembed_kernel'"),
    "an extra tensor": (_added("decoder.extra.weight", torch.zeros(3)),
                        "the checkpoint's 'ema_params1' hold decoder.extra.weight, which an ELF network of its sizes "
                        "has no place for"),
    "a mis-shaped output layer": (_reshaped("final_layer.linear.weight", 5),
                                  "final_layer.linear.weight: ELF's tensor has shape (5, 24), where an ELF network of "
                                  "the checkpoint's sizes has (12, 24)"),
    "a mis-shaped transposed kernel": (_reshaped("unembed_kernel", 11),
                                       "unembed_kernel: ELF's tensor has shape (11, 37), where an ELF network of the "
                                       "checkpoint's sizes has (12, 37)"),
    "a mis-shaped attention projection": (_reshaped("blocks.1.attn.qkv.weight", 69),
                                          "blocks.1.attn.qkv.weight: ELF's tensor has shape (69, 24), where an ELF "
                                          "network of width 24 and 3 heads has 72 rows"),
    "a mis-shaped q-norm": (_reshaped("blocks.2.attn.q_norm.weight", 5),
                            "blocks.2.attn.q_norm.weight: ELF's tensor has shape (5,), where an ELF network of width "
                            "24 and 3 heads has 8 rows"),
}


@pytest.mark.parametrize("case", CASES)
def test_tensors_that_do_not_fit_are_named(case, tmp_path, capsys):
    change, line = CASES[case]
    status, err, out = _import(tmp_path, capsys, change(_payload()))
    assert (status, err) == (2, [f"elfreg import-elf: error: {line}"]) and not out.exists()


@pytest.mark.parametrize(("payload", "fault"), [
    (b"not a checkpoint at all\n", r"cannot read ELF checkpoint \S+checkpoint_1000: not a torch.save payload \("),
    ({"step": 1000}, r"\S+checkpoint_1000 is not an ELF checkpoint \(no 'params' state dict\)$"),
    (torch.zeros(3), r"\S+checkpoint_1000 is not an ELF checkpoint \(no 'params' state dict\)$"),
    ({"params": [1, 2]}, r"is not an ELF checkpoint \('params' is not a state dict of tensors\)$"),
    ({"params": {"blocks.0.attn.qkv.weight": "text"}}, r"\('params' is not a state dict of tensors\)$"),
])
def test_a_file_that_is_not_an_elf_checkpoint_is_refused(payload, fault, tmp_path, capsys):
    status, err, out = _import(tmp_path, capsys, payload)
    assert status == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith("elfreg import-elf: error: ") and re.search(fault, err[0]), err[0]


@pytest.mark.parametrize(("yaml_text", "fault"), [
    ("model: ELF-B\nencoder: [unclosed\n", r"train.yml: not valid YAML \(while parsing a flow sequence\)$"),
    ("- ELF-B\n- t5-small\n", r"train.yml: an ELF training YAML is a mapping of settings$"),
    ("max_length: many\n", r"ELF training YAML: max_length must be a number, got 'many'$"),
    ("ema_decay1: true\n", r"ELF training YAML: ema_decay1 must be a number, got True$"),
])
def test_a_training_yaml_that_cannot_be_read_is_named(yaml_text, fault, tmp_path, capsys):
    status, err, out = _import(tmp_path, capsys, _payload(), yaml_text)
    assert status == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith("elfreg import-elf: error: ") and re.search(fault, err[0]), err[0]


def test_numbers_written_as_text_are_read_as_numbers(tmp_path, capsys):
    # PyYAML reads 5e-5 (no dot) as text; ELF's own configs write learning rates so
    status, err, out = _import(tmp_path, capsys, _payload(), "blr: 5e-5\nglobal_batch_size: 512\nlr: -1\n")
    assert (status, err) == (0, [])
    assert "lr: 0.0001" in (out / "config.yaml").read_text()


def test_ema_weights_asked_of_a_checkpoint_without_them(tmp_path, capsys):
    payload = {k: v for k, v in _payload().items() if k != "ema_params1"}
    status, err, out = _import(tmp_path, capsys, payload)
    assert (status, err) == (2, ["elfreg import-elf: error: the checkpoint has no 'ema_params1' weights "
                                 "(--weights params imports its params)"]) and not out.exists()
    (tmp_path / "elf").rename(tmp_path / "again")
    status, err, out = _import(tmp_path, capsys, payload, None, "--weights", "params")
    assert (status, err) == (0, []) and (out / "model.safetensors").is_file()
