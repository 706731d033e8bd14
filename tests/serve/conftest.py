"""The serving tests' shared server: the served checkpoint on a loopback port, one per test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def running(served_checkpoint):
    pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")
    pytest.importorskip("openai", reason="the serving tests speak through the openai client (dev extra)")
    from serve_http import Running

    r = Running(served_checkpoint, max_batch=8, max_queue=32)
    yield r
    r.stop()
