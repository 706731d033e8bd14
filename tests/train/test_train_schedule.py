"""The one learning-rate schedule: warmup, then cosine to a floor (or constant)."""

import math

import pytest

from elfreg.config import TrainConfig
from elfreg.train.optim import lr_at, scheduled_lr


def test_warmup_then_cosine_to_the_floor():
    lrs = [scheduled_lr(s, 1.0, 4, 12, 0.1) for s in range(16)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]  # (step + 1) / warmup: the first step already moves
    assert lrs[4] == 1.0
    assert lrs[8] == pytest.approx(0.55, abs=1e-15)  # halfway down the cosine: (1 + 0.1) / 2
    assert all(a > b for a, b in zip(lrs[4:12], lrs[5:12], strict=False))
    assert lrs[12:] == [pytest.approx(0.1, abs=1e-15)] * 4  # held at the floor after total_steps


def test_constant_kind_keeps_the_peak_after_warmup():
    assert [scheduled_lr(s, 2.0, 2, 6, 0.1, "constant") for s in range(8)] == [1.0, 2.0] + [2.0] * 6


def test_no_warmup_and_warmup_covering_the_whole_run():
    assert scheduled_lr(0, 1.0, 0, 10, 0.0) == 1.0
    assert scheduled_lr(10, 1.0, 0, 10, 0.0) == 0.0
    assert [scheduled_lr(s, 1.0, 3, 3, 0.1) for s in range(4)] == [1 / 3, 2 / 3, 1.0, 1.0]


def test_lr_at_reads_the_train_settings():
    tc = TrainConfig(steps=50, lr=3e-4, warmup_steps=7, min_lr_ratio=0.2, schedule="cosine")
    assert [lr_at(s, tc) for s in range(60)] == [scheduled_lr(s, 3e-4, 7, 50, 0.2, "cosine") for s in range(60)]
    tc = TrainConfig(steps=50, lr=3e-4, warmup_steps=7, schedule="constant")
    assert [lr_at(s, tc) for s in range(60)] == [scheduled_lr(s, 3e-4, 7, 50, 0.1, "constant") for s in range(60)]


def test_decay_steps_sets_the_cosine_length_and_a_longer_run_holds_its_floor():
    short = TrainConfig(steps=50, lr=3e-4, warmup_steps=7, min_lr_ratio=0.2, schedule="cosine")
    longer = TrainConfig(steps=80, decay_steps=50, lr=3e-4, warmup_steps=7, min_lr_ratio=0.2, schedule="cosine")
    assert [lr_at(s, longer) for s in range(50)] == [lr_at(s, short) for s in range(50)]  # the same course
    assert [lr_at(s, longer) for s in range(50, 80)] == [pytest.approx(3e-4 * 0.2, abs=1e-18)] * 30
    assert lr_at(60, TrainConfig(steps=80, lr=3e-4, warmup_steps=7, schedule="cosine")) > 3e-4 * 0.2


def _former_toy_schedule(step: int, lr: float, warmup: int, steps: int) -> float:
    """The toy LMs' own schedule before they used the shared one (kept here as the reference)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@pytest.mark.parametrize(("lr", "warmup", "steps"), [(3e-3, 30, 1600), (3e-3, 30, 2000), (3e-3, 30, 150),
                                                     (5e-3, 5, 40), (1e-2, 5, 60), (3e-3, 0, 10)])
def test_toy_pretraining_schedule_is_the_former_one(lr, warmup, steps):
    for s in range(steps + 3):
        ours, former = scheduled_lr(s, lr, warmup, steps, 0.1), _former_toy_schedule(s, lr, warmup, steps)
        if s < warmup:
            assert ours == former
        else:  # same formula, summed in another order: equal to the last bits of a float
            assert ours == pytest.approx(former, rel=1e-15, abs=0)
