"""The clients of ``benchmarks/serve_load.py``, in a process of their own. This module imports
only the ``openai`` client and the standard library, so that the process starts in a moment
(the server side imports torch and the model)."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

_finished: Any = None
"""In the clients' process: where each client reports (run, client) once it has sent its last
request."""


def hand_over(finished: Any) -> None:
    """The process's initializer: keep the queue the clients report on."""
    global _finished
    _finished = finished


def send(url: str, clients: int, prompts: list[str], settings: dict[str, Any], run_id: int
             ) -> tuple[list[float], int, dict[int, str], float]:
    """``clients`` threads of the ``openai`` client, each sending its requests one after
    another with Poisson arrivals (serve_load's docstring); their latencies, answer tokens,
    texts by request id, and the wall seconds of the whole."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=3600)
    latencies: list[float] = []
    tokens = 0
    texts: dict[int, str] = {}
    lock = threading.Lock()

    def one_client(c: int) -> None:
        nonlocal tokens
        rng = random.Random(settings["seed"] * 1000 + c)
        try:
            for k in range(settings["requests"]):
                time.sleep(rng.expovariate(1 / settings["think"]) if settings["think"] > 0 else 0)
                rid = c * settings["requests"] + k
                t0 = time.monotonic()
                out = client.completions.create(model="bench", prompt=prompts[rid % len(prompts)], seed=rid,
                                                extra_body={"nfe": settings["nfe"], "sampler": settings["sampler"]})
                with lock:
                    latencies.append(time.monotonic() - t0)
                    tokens += out.usage.completion_tokens
                    texts[rid] = out.choices[0].text
        finally:
            _finished.put((run_id, c))

    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one_client, range(clients)))
    return latencies, tokens, texts, time.monotonic() - start
