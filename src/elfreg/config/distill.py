"""The ``distill`` section: progressive distillation of a trained student into few-step students,
ELF's (its ``distillation`` branch), as ``elfreg distill`` runs it (docs/distillation.md).

A curriculum is a list of rounds; round k trains a student of ``student_steps[k]`` steps (span
h = 1/N) against targets the frozen teacher makes with ``teacher_steps[k]`` Euler sub-steps per
student step. ELF's curriculum halves the student's steps each round and keeps the teacher's
resolution at 64 steps over [0, 1] (h × sub-steps = 1/64): the defaults.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

DistillSchedule = Literal["logit-normal", "uniform"]
DISTILL_SCHEDULES: tuple[str, ...] = typing.get_args(DistillSchedule)
TeacherWeights = Literal["ema", "params"]
RoundSampling = Literal["elf-pd", "sample"]


@dataclass
class DistillConfig:
    """Progressive distillation's settings; the rest of a distillation run is the teacher's
    network and objective settings (``text``, ``model``, ``flow``, ``loss``) and the run's own
    ``train`` (per round), ``data`` and ``sample`` sections."""

    student_steps: list[int] = field(default_factory=lambda: [16, 8, 4, 2, 1])  # one round each, in order
    teacher_steps: list[int] = field(default_factory=lambda: [4, 8, 16, 32, 64])  # sub-steps per student step
    student_schedule: DistillSchedule = "logit-normal"  # the draw of a student step's start t_s
    teacher_schedule: DistillSchedule = "logit-normal"  # the draw of the sub-steps' inner times
    # the teacher's weights, and those each round starts from (the previous round's, the teacher's)
    teacher_weights: TeacherWeights = "ema"
    init_from: str | None = None  # the first round's starting student (default: the teacher's weights)
    # how each round's checkpoint samples, at N + 1 NFE: elf-pd, ELF's setting for N steps
    # (few_step_sampling: elf-pd-few up to 8 steps, elf-pd-many beyond); sample, the sample section
    round_sampling: RoundSampling = "elf-pd"

    @property
    def rounds(self) -> list[tuple[int, int]]:
        """(student steps, teacher sub-steps per student step) of each round, in order."""
        return list(zip(self.student_steps, self.teacher_steps, strict=True))

    def checks(self) -> list[tuple[str, bool, str]]:
        """Range checks of the distill section: (key, ok, why)."""
        return [
            ("distill.student_steps", bool(self.student_steps) and all(n >= 1 for n in self.student_steps),
             "must list at least one round, each of >= 1 steps"),
            ("distill.teacher_steps", all(k >= 1 for k in self.teacher_steps), "each must be >= 1"),
            ("distill.teacher_steps", len(self.teacher_steps) == len(self.student_steps),
             f"must give one count per round ({len(self.student_steps)} rounds in distill.student_steps)"),
            ("distill.student_schedule", self.student_schedule in DISTILL_SCHEDULES,
             f"must be one of {', '.join(DISTILL_SCHEDULES)}"),
            ("distill.teacher_schedule", self.teacher_schedule in DISTILL_SCHEDULES,
             f"must be one of {', '.join(DISTILL_SCHEDULES)}"),
            ("distill.teacher_weights", self.teacher_weights in ("ema", "params"), "must be ema or params"),
            ("distill.init_from", self.init_from is None or bool(self.init_from.strip()), "must not be empty"),
            ("distill.round_sampling", self.round_sampling in ("elf-pd", "sample"), "must be elf-pd or sample"),
        ]
