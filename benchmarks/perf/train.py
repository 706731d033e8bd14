"""The student's training step, split into forward / backward / optimiser step, with synthetic
frozen features (random tensors of the encoder's and teacher's shapes), so no frozen LM is
loaded for the student-side numbers.

Each step runs the library's own pieces in the order :func:`elfreg.train.step.train_step` does:
:func:`~elfreg.flow.objective.elf_reg_loss` under the run's autocast (forward, including the
auxiliary self-conditioning forwards), ``backward`` of the total loss, then gradient clipping
and the AdamW of :func:`~elfreg.train.optim.make_optimizer` (optimiser step). The objective's
draws come from a generator reseeded every step, so every repeat does the same work.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from elfreg.config import Config
from elfreg.flow.objective import TrainBatch, elf_reg_loss
from elfreg.model.presets import student_from_config
from elfreg.text.canvas import Canvas
from elfreg.text.frozen import TeacherTargets
from elfreg.train.optim import AdamWImpl, make_optimizer

from .common import autocast_for, interleaved, synchronize, timed
from .flops import flop_counter
from .gemm import GemmProbe


@dataclass(frozen=True)
class Shape:
    """A student shape and the frozen models' widths it is sized to."""

    name: str
    width: int
    depth: int
    heads: int
    repa_block: int
    projector_hidden: int
    enc_dim: int
    teacher_dim: int
    vocab: int
    batch: int
    canvas: int
    prompt: int  # prompt positions of every row (the rest is answer)
    time_freq_dim: int = 256

    def config(self, reg: bool) -> Config:
        """The run config of this shape: ELF-REG (REPA + REG) or plain ELF."""
        return Config.from_dict({
            "text": {"canvas_len": self.canvas, "prompt_cap": self.prompt},
            "model": {"width": self.width, "depth": self.depth, "heads": self.heads, "repa_block": self.repa_block,
                      "projector_hidden": self.projector_hidden, "time_freq_dim": self.time_freq_dim,
                      "repa": reg, "extra_token": "reg" if reg else "none"},
            "train": {"batch_size": self.batch, "steps": 1000, "warmup_steps": 10, "optimizer": "adamw"},
        })


def synthetic_batch(shape: Shape, device: torch.device, seed: int = 0) -> TrainBatch:
    """A batch with ``shape.prompt`` prompt positions per row, answers of random length (at
    least half the answer region) then EOS padding (id 0), random standardised encoder states
    and random teacher targets."""
    g = torch.Generator().manual_seed(seed)
    b, length = shape.batch, shape.canvas
    pos = torch.arange(length)
    prompt_lens = torch.full((b,), shape.prompt, dtype=torch.long)
    room = length - shape.prompt
    answer_lens = torch.randint(room // 2, room + 1, (b,), generator=g)
    tokens = torch.randint(1, shape.vocab, (b, length), generator=g)
    special = pos[None, :] >= (prompt_lens + answer_lens)[:, None]
    tokens[special] = 0
    prompt_mask = pos[None, :] < prompt_lens[:, None]
    canvas = Canvas(tokens, prompt_mask, ~prompt_mask & ~special, special, prompt_lens, prompt_lens + answer_lens
                    ).to(device)
    x = torch.randn(b, length, shape.enc_dim, generator=g).to(device)
    teacher = TeacherTargets(repa=torch.randn(b, length, shape.teacher_dim, generator=g).to(device),
                             reg=torch.randn(b, shape.teacher_dim, generator=g).to(device),
                             reg_repa=torch.randn(b, shape.teacher_dim, generator=g).to(device))
    return TrainBatch(canvas=canvas, x=x, teacher=teacher)


class StepCase:
    """One student, its optimiser and a fixed batch: :meth:`step` runs a training step and
    returns the seconds of each phase."""

    def __init__(self, shape: Shape, reg: bool, precision: str, device: torch.device,
                 adamw: AdamWImpl = "auto"):
        torch.manual_seed(0)
        self.cfg = shape.config(reg)
        self.device, self.precision = device, precision
        self.student = student_from_config(self.cfg, shape.enc_dim, shape.vocab,
                                           shape.teacher_dim if reg else None).to(device)
        tc = self.cfg.train
        self.optimizer = make_optimizer(self.student, tc, adamw)
        self.batch = synthetic_batch(shape, device)
        if not reg:
            self.batch = dataclasses.replace(self.batch, teacher=None)

    def _loss(self) -> torch.Tensor:
        gen = torch.Generator(device=self.device).manual_seed(1234)
        with autocast_for(self.device, self.precision):
            out = elf_reg_loss(self.student, self.batch, self.cfg.flow, self.cfg.loss, gen)
        return out.total

    def step(self) -> dict[str, float]:
        """One step; seconds of forward, backward and optimiser (clip + AdamW step)."""
        import time

        sync = lambda: synchronize(self.device)  # noqa: E731
        self.optimizer.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        total = self._loss()
        sync()
        t1 = time.perf_counter()
        total.backward()
        sync()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.student.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        sync()
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "step": t3 - t0}

    def flops(self) -> dict[str, float]:
        """FLOPs of one forward and one backward (:func:`perf.flops.flop_counter`: matmuls and
        attention)."""
        self.optimizer.zero_grad(set_to_none=True)
        with flop_counter() as fwd:
            total = self._loss()
        with flop_counter() as bwd:
            total.backward()
        self.optimizer.zero_grad(set_to_none=True)
        return {"forward": float(fwd.get_total_flops()), "backward": float(bwd.get_total_flops())}

    def parameters(self) -> int:
        return sum(p.numel() for p in self.student.parameters())


def interleaved_steps(cases: dict[str, Any], repeats: int, warmup: int = 1) -> dict[str, dict[str, float]]:
    """Median seconds of every phase of every case (objects whose ``step()`` returns phase
    seconds), steps interleaved across the cases."""
    import statistics

    for _ in range(warmup):
        for case in cases.values():
            case.step()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, case in cases.items():
            runs[name].append(case.step())
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}


class _ProbeStep:
    def __init__(self, probe: GemmProbe, device: torch.device):
        self.probe, self.device = probe, device

    def step(self) -> dict[str, float]:
        return {"step": timed(self.probe, self.device)}


def train_section(shape: Shape, precision: str, ceiling_gflops: float, repeats: int, device: torch.device,
                  probe_n: int = 2048, frozen: dict[str, Any] | None = None) -> dict:
    """ELF-REG and ELF steps at ``shape`` and a GEMM probe (n = ``probe_n``, ``precision``),
    interleaved: phase seconds, FLOPs, achieved GFLOP/s of forward + backward and its fraction of
    the probe's GFLOP/s in the same rounds (``fraction_of_ceiling``) and of ``ceiling_gflops``
    (the run's GEMM section, ``fraction_of_run_ceiling``), the ELF-REG/ELF ratio of step time and
    the optimiser's share of the step. ``frozen``: the frozen reads ``encoder_read`` and
    ``teacher_read`` (:func:`perf.frozen.frozen_cases`), timed in the same rounds; then
    ``end_to_end`` holds each model's step with the reads it needs (ELF: the encoder; ELF-REG:
    both) and their ratio."""
    cases = {"elf_reg": StepCase(shape, True, precision, device), "elf": StepCase(shape, False, precision, device)}
    flops = {name: c.flops() for name, c in cases.items()}
    probe = GemmProbe(probe_n, precision, device)
    seconds = interleaved_steps({**cases, **(frozen or {}), "gemm_probe": _ProbeStep(probe, device)}, repeats)
    probe_gflops = probe.gflops(seconds["gemm_probe"]["step"])
    out: dict[str, Any] = {"shape": dataclasses.asdict(shape), "precision": precision, "repeats": repeats,
                           "probe": {"n": probe_n, "gflops": probe_gflops}}
    for name, c in cases.items():
        s, f = seconds[name], flops[name]
        fb_flops = f["forward"] + f["backward"]
        gflops = fb_flops / (s["forward"] + s["backward"]) / 1e9
        out[name] = {"seconds": s, "flops": f, "parameters": c.parameters(),
                     "fwd_bwd_gflops": gflops, "fraction_of_ceiling": gflops / probe_gflops,
                     "fraction_of_run_ceiling": gflops / ceiling_gflops,
                     "step_fraction_of_ceiling": fb_flops / s["step"] / 1e9 / probe_gflops,
                     "optimizer_share": s["optimizer"] / s["step"]}
    out["elf_reg_over_elf"] = seconds["elf_reg"]["step"] / seconds["elf"]["step"]
    if frozen:
        enc, tea = seconds["encoder_read"]["step"], seconds["teacher_read"]["step"]
        elf, reg = seconds["elf"]["step"] + enc, seconds["elf_reg"]["step"] + enc + tea
        out["end_to_end"] = {"encoder_read": enc, "teacher_read": tea, "elf_step": elf, "elf_reg_step": reg,
                             "elf_reg_over_elf": reg / elf, "frozen_share_elf_reg": (enc + tea) / reg}
    del cases
    return out


def optimizer_section(shape: Shape, repeats: int, device: torch.device) -> dict:
    """The optimiser step (clip + update) of the ELF-REG student at ``shape`` with each AdamW
    implementation and with ``train.optimizer: muon`` (Muon on the blocks' matrices, fused AdamW
    on the rest), on the same random gradients, timed interleaved; ``speedup`` is for-loop / each."""
    torch.manual_seed(0)
    cfg = shape.config(True)
    student = student_from_config(cfg, shape.enc_dim, shape.vocab, shape.teacher_dim).to(device)
    for p in student.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    impls: list[AdamWImpl] = ["for-loop", "foreach", "fused"]
    optims = {impl: make_optimizer(student, cfg.train, impl) for impl in impls}
    optims["muon"] = make_optimizer(student, dataclasses.replace(cfg.train, optimizer="muon"), "fused")

    def stepper(opt):
        def run() -> None:
            torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.train.grad_clip)
            opt.step()
        return run

    seconds = interleaved({impl: stepper(o) for impl, o in optims.items()}, repeats, device)
    return {"shape": shape.name, "parameters": sum(p.numel() for p in student.parameters()), "repeats": repeats,
            "seconds": seconds, "speedup": {k: seconds["for-loop"] / v for k, v in seconds.items()}}
