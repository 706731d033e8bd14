"""Examples and readers shared by the training tests."""

import json

from elfreg.data.examples import Example

EXAMPLES = [Example(f"add {a} {b}", f"{a}+{b}={a + b}") for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]


def metrics(run_dir) -> list[dict]:
    """The lines of a run's ``metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
