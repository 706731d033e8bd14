"""Examples and readers shared by the training tests."""

import json

from elfreg.data.examples import Example
from elfreg.train import step as step_module

EXAMPLES = [Example(f"add {a} {b}", f"{a}+{b}={a + b}") for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]


def metrics(run_dir) -> list[dict]:
    """The lines of a run's ``metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def poison_loss(monkeypatch, call: int, factor: float) -> None:
    """Make the ``call``-th loss of training (1-based, one per micro-batch) ``factor`` times
    its value, e.g. ``nan`` or ``inf``."""
    real = step_module.elf_reg_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        out = real(*args, **kwargs)
        if calls["n"] == call:
            out.total = out.total * factor
        return out

    monkeypatch.setattr(step_module, "elf_reg_loss", poisoned)
