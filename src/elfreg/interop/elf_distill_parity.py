"""Parity of elfreg's progressive distillation with ELF's own ``distill_train_step`` (its branch
``distillation``; docs/distillation.md).

``tools/elf_distill_reference.py`` runs ELF's step on a small teacher and student and records, per
case (one batch, one call), what the step drew and computed (its file format is in the tool's
docstring). :func:`check_distill_parity` imports both networks into elfreg (their training YAML,
:mod:`elfreg.interop.elf_import`) and, from ELF's draws, recomputes:

- ``target``: the teacher's target x* of the distillation rows at their answer positions, where
  the loss reads it (:func:`~elfreg.train.distill_objective.teacher_targets`, elfreg's sampling
  loop over ELF's sub-step grid), and ``self_cond``: the self-conditioning input the teacher's
  first step and the student share;
- ``loss``, ``ce_loss``, ``l2_loss``: the batch's loss and its two parts from the student's
  predictions on ELF's student input (:func:`~elfreg.flow.distill.distill_terms`);
- ``objective.*``: the same three by elfreg's whole objective
  (:func:`~elfreg.train.distill_objective.distill_loss`) from ELF's draws, for a case whose decode
  rows have no prompt positions: there ELF's step gives a decode row the clean prompt as its
  self-conditioning input where elfreg gives zeros, as its training step and sampler do
  (docs/distillation.md).

A case passes when every difference is within 1e-4 × max(1, max |reference|) (fp32).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import Config
from ..flow.distill import SPAN_FLOOR, DistillDraws, distill_terms
from ..flow.losses import token_cross_entropy
from ..flow.objective import TrainBatch
from ..model.student import Student
from ..sampling.network import StudentNetwork
from ..text.canvas import Canvas
from ..train.distill_objective import distill_loss, teacher_targets
from .elf_import import elf_sizes, elfreg_config, imported_student, read_elf_yaml
from .elf_parity import RELATIVE_TOLERANCE, CaseResult, read_tensor_file

CASE_KEYS = ("x0", "cond_seq_mask", "input_ids", "decoder_mask", "t_s", "t_t", "w", "z_t_s", "sc_half", "target",
             "student_input", "loss", "ce_loss", "l2_loss")


def read_distill_parity(path: str | Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict[int, dict], dict]:
    """A distillation parity file: the networks' ELF state dicts by prefix (``teacher``,
    ``student``), the cases by index, the metadata (``"{i}.pd_step_size"`` …)."""
    tensors, meta = read_tensor_file(path, "distillation parity file")
    networks: dict[str, dict[str, torch.Tensor]] = {"teacher": {}, "student": {}}
    cases: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        head, _, name = key.partition(".")
        if head in networks:
            networks[head][name] = value
        elif head.isdigit():
            cases.setdefault(int(head), {})[name] = value
    if not networks["teacher"] or not networks["student"] or not cases:
        raise ValueError(f"{path} is not a distillation parity file (teacher.*, student.* and cases 0.*, …)")
    for i, case in cases.items():
        missing = [k for k in CASE_KEYS if k not in case] + [k for k in ("pd_step_size", "pd_teacher_steps")
                                                             if f"{i}.{k}" not in meta]
        if missing:
            raise ValueError(f"{path}: case {i} lacks {', '.join(missing)}")
    return networks, dict(sorted(cases.items())), meta


def imported_pair(networks: dict[str, dict[str, torch.Tensor]], elf_yaml: str | Path
                  ) -> tuple[Student, Student, Config]:
    """The teacher and the student as elfreg networks (fp32, eval), with their elfreg config."""
    sizes = elf_sizes(networks["teacher"])
    cfg = elfreg_config(sizes, read_elf_yaml(elf_yaml))
    teacher, student = (imported_student({"params": networks[k]}, "params", cfg, sizes) for k in ("teacher", "student"))
    return teacher, student, cfg


def _within(differences: dict[str, float], references: dict[str, torch.Tensor], i: int) -> CaseResult:
    limits = {k: RELATIVE_TOLERANCE * max(1.0, float(references[k].abs().max())) for k in differences}
    return CaseResult(i, differences, limits)


def _draws(case: dict[str, torch.Tensor], span: float, sigma: float, decode_scale: float) -> DistillDraws:
    """ELF's draws of a case, in elfreg's form: u from t_s, the noise from z_{t_s}, a decode row's
    input as its noise at λ = 0, the inner times from the sub-step grid."""
    x0, z, t_s = case["x0"], case["z_t_s"], case["t_s"]
    decode = case["decoder_mask"] > 0
    c = x0.shape[-1]
    left = (1 - t_s).masked_fill(decode, 1.0)[:, None, None]  # decode rows draw nothing of these
    noise = ((z - t_s[:, None, None] * x0) / (left * sigma)) * ~decode[:, None, None]
    decode_noise = case["student_input"][..., :c] / decode_scale * decode[:, None, None]
    times = case.get("sub_step_times")
    inner = torch.zeros(len(t_s), 0) if times is None else (times[:, 1:-1] - t_s[:, None]) / span
    return DistillDraws(u=(t_s / max(1 - span, SPAN_FLOOR)).masked_fill(decode, 0.0), decode=decode,
                        self_cond=_self_conditioned(case), w=case["w"], lam=torch.zeros(z.shape[:2]), noise=noise,
                        decode_noise=decode_noise, reg_noise=None, reg_decode_noise=None, inner=inner)


def _self_conditioned(case: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B,) the distillation rows ELF self-conditioned: nonzero self-conditioning off the prompt."""
    answer = (case["cond_seq_mask"] == 0)[..., None]
    return ((case["sc_half"] * answer).abs().amax((1, 2)) > 0) & (case["decoder_mask"] == 0)


@torch.no_grad()
def check_case(teacher: Student, student: Student, cfg: Config, case: dict[str, torch.Tensor], span: float,
               sub_steps: int, i: int = 0) -> CaseResult:
    """One case of a distillation parity file recomputed by elfreg (see the module docstring)."""
    x0 = case["x0"].float()
    prompt, decode = case["cond_seq_mask"] > 0, case["decoder_mask"] > 0
    rows = (~decode).nonzero().squeeze(1)
    net = StudentNetwork(teacher)
    times = case.get("sub_step_times")
    times = torch.stack([case["t_s"], case["t_t"]], 1) if times is None else times
    if times.shape[1] != sub_steps + 1:
        raise ValueError(f"case {i}: a grid of {times.shape[1]} times for {sub_steps} teacher steps")
    got = teacher_targets(net, x0[rows], prompt[rows], case["z_t_s"][rows], None, times[rows], case["w"][rows],
                          _self_conditioned(case)[rows], cfg.flow)
    # the target where the loss reads it (ELF's one-step target is the teacher's raw output, which
    # ELF does not restore to the prompt)
    answer = ~prompt[rows]
    differences = {"target": float((got.x - case["target"][rows])[answer].abs().max()),
                   "self_cond": float((got.q - case["sc_half"][rows]).abs().max())}
    references = {"target": case["target"][rows][answer], "self_cond": case["sc_half"][rows]}

    c = x0.shape[-1]
    x_in = case["student_input"].float()
    out = student(x_in[..., :c], x_in[..., c:], torch.where(decode, 1.0, case["t_s"]), case["w"], prompt,
                  decode=decode)
    ce = token_cross_entropy(student.decode_logits(out.hidden), case["input_ids"].long())
    terms = distill_terms(out.x_hat, case["target"], ce, ~prompt, decode, None, 0.0)
    mine = {"loss": terms.total, "ce_loss": terms.decode, "l2_loss": terms.denoise}
    if not (decode[:, None] & prompt).any():
        tokens = case["input_ids"].long()
        canvas = Canvas(tokens, prompt, ~prompt, torch.zeros_like(prompt), prompt.sum(1), torch.full_like(tokens[:, 0],
                                                                                                           tokens.shape[1]))
        whole = distill_loss(student, net, TrainBatch(canvas, x0), cfg.flow, cfg.loss, span,
                             _draws(case, span, cfg.flow.sigma, cfg.flow.decode_noise_scale))
        mine.update({"objective.loss": whole.total, "objective.ce_loss": whole.decode,
                     "objective.l2_loss": whole.denoise})
    for name, value in mine.items():
        reference = case[name.removeprefix("objective.")]
        differences[name], references[name] = float((value - reference).abs()), reference
    return _within(differences, references, i)


def check_distill_parity(path: str | Path, elf_yaml: str | Path) -> list[CaseResult]:
    """Every case of a distillation parity file (``tools/elf_distill_reference.py``) recomputed by
    elfreg, with the networks imported by the training YAML ``elf_yaml``."""
    networks, cases, meta = read_distill_parity(path)
    teacher, student, cfg = imported_pair(networks, elf_yaml)
    return [check_case(teacher, student, cfg, case, float(meta[f"{i}.pd_step_size"]),
                       int(meta[f"{i}.pd_teacher_steps"]), i) for i, case in cases.items()]
