"""Stand-ins for a toy LM's pretraining in the builder tests, called as ``build(*args,
num_threads, before_step)``; module-level, so that a spawned builder process imports them."""

from __future__ import annotations

import threading


def steps_then_waits(*args) -> dict:
    """Takes one step, then trains for ever (until its process is stopped)."""
    before_step = args[-1]
    before_step()
    threading.Event().wait()
    return {}


def fails(*args) -> dict:
    raise ValueError("no such corpus")


def steps(name: str, count: int, num_threads: int | None, before_step) -> dict:
    """Takes ``count`` steps and reports how many threads it was told to use at each."""
    return {"name": name, "threads": [before_step() for _ in range(count)]}


def by_name(kind: str, num_threads: int | None, before_step) -> dict:
    """``steps_then_waits`` ("wait") or ``fails`` ("fail")."""
    return (steps_then_waits if kind == "wait" else fails)(kind, num_threads, before_step)
