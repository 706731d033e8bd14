"""Parity files: cases of ELF's ``ELF.forward`` with its outputs, and the check that elfreg's
imported student reproduces them (``elfreg import-elf --check``, docs/elf.md).

A parity file is a safetensors file; case i = 0, 1, … holds inputs named as ``ELF.forward``'s
arguments and ELF's outputs:

- ``"{i}.x"`` (B, S, C) or (B, S, 2C): the noisy state, with the self-conditioning input
  concatenated on channels when 2C (a C-wide input skips ELF's ``self_cond_proj``);
- ``"{i}.t"`` (B,), ``"{i}.self_cond_cfg_scale"`` (B,);
- optional ``"{i}.attention_mask"`` (B, S), 1 = valid; optional ``"{i}.decoder_step_active"``
  (B,), the per-row 0/1 gate of the mode tokens;
- ``"{i}.output"`` (B, S, C) and, when the gate is given, ``"{i}.decoder_logits"`` (B, S, V).

``tools/elf_reference.py`` writes such files by running ELF's own code. A case passes when each
output is within 1e-4 × max(1, max |reference|) of ELF's, computed in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..model.student import Student

RELATIVE_TOLERANCE = 1e-4


@dataclass
class CaseResult:
    """One case: the largest absolute difference of each output and its limit."""

    case: int
    differences: dict[str, float]
    limits: dict[str, float]

    @property
    def ok(self) -> bool:
        return all(self.differences[k] <= self.limits[k] for k in self.differences)

    def line(self) -> str:
        parts = [f"{k} max|diff| {self.differences[k]:.2e} (limit {self.limits[k]:.1e})" for k in self.differences]
        return f"case {self.case}: {', '.join(parts)}: {'ok' if self.ok else 'FAILED'}"


def read_tensor_file(path: str | Path, what: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors file ``what`` names (a parity file, a trace file),
    or a one-line ``ValueError`` saying why it cannot be read."""
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), "pt") as f:
            return tensors, f.metadata() or {}
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type
        raise ValueError(f"cannot read {what} {path}: {str(err).strip().splitlines()[0]}") from err


def read_cases(path: str | Path) -> dict[int, dict[str, torch.Tensor]]:
    """The cases of a parity file, by index; each a dict of its tensors under their short names."""
    tensors, _ = read_tensor_file(path, "parity file")
    cases: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        if not index.isdigit() or not name:
            continue
        cases.setdefault(int(index), {})[name] = value
    if not cases:
        raise ValueError(f"{path} holds no parity cases ('0.x', '0.t', ...)")
    for i, case in cases.items():
        missing = [k for k in ("x", "t", "self_cond_cfg_scale", "output") if k not in case]
        if missing:
            raise ValueError(f"{path}: case {i} lacks {', '.join(missing)}")
    return dict(sorted(cases.items()))


@torch.no_grad()
def run_case(student: Student, case: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The student's outputs for one case, in fp32 on the CPU, called as ELF's forward is: the
    mode gate is the case's ``decoder_step_active`` (0 without it), t and the self-conditioning
    input as given, no prompt positions."""
    student = student.float().cpu().eval()
    x = case["x"].float()
    width = student.enc_dim
    if x.shape[-1] not in (width, 2 * width):
        raise ValueError(f"x has {x.shape[-1]} channels; this model takes {width} or {2 * width}")
    z, self_cond = (x, None) if x.shape[-1] == width else (x[..., :width], x[..., width:])
    no_prompt = torch.zeros(x.shape[:2], dtype=torch.bool)
    gate = case.get("decoder_step_active")
    out = student(z, self_cond, case["t"].float(), case["self_cond_cfg_scale"].float(), no_prompt,
                  decode=None if gate is None else gate.float(), attention_mask=case.get("attention_mask"))
    result = {"output": out.x_hat}
    if gate is not None:
        result["decoder_logits"] = student.decode_logits(out.hidden)
    return result


def check_parity(student: Student, path: str | Path) -> list[CaseResult]:
    """Every case of the parity file run through ``student`` against ELF's outputs."""
    results = []
    for i, case in read_cases(path).items():
        got = run_case(student, case)
        differences, limits = {}, {}
        for name in ("output", "decoder_logits"):
            if name not in case:
                continue
            if name not in got:
                raise ValueError(f"{path}: case {i} has decoder_logits but no decoder_step_active")
            reference = case[name].float()
            if got[name].shape != reference.shape:
                raise ValueError(f"{path}: case {i} {name} has shape {tuple(reference.shape)}, the student gives "
                                 f"{tuple(got[name].shape)}")
            differences[name] = float((got[name] - reference).abs().max())
            limits[name] = RELATIVE_TOLERANCE * max(1.0, float(reference.abs().max()))
        results.append(CaseResult(i, differences, limits))
    return results
