"""``elfreg serve`` as a process: SIGTERM stops taking requests and finishes those in flight
(each answered in full, as ``generate`` answers it); then the process ends by the signal it got
(uvicorn re-raises it once shut down: status 143 in a shell), as a service manager expects."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from serve_prompts import PROMPTS

pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")

import elfreg  # noqa: E402


def _post(url: str, payload: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, json.loads(r.read())


def test_sigterm_finishes_the_requests_in_flight_and_refuses_new_ones(served_checkpoint):
    proc = subprocess.Popen([sys.executable, "-m", "elfreg.cli", "serve", "--checkpoint", str(served_checkpoint),
                             "--port", "0", "--max-batch", "4", "--device", "cpu", "--graceful-timeout", "60",
                             "--max-nfe", "400"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = found.group(1)
        answers: dict[int, tuple[int, dict]] = {}
        settings = {"nfe": 400, "sampler": "early-stop"}  # long enough to be in flight at the signal

        def ask(k: int) -> None:
            answers[k] = _post(f"{url}/v1/completions", {"prompt": PROMPTS[k], "seed": k, **settings})

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until all three are admitted
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
                if "elfreg_requests_in_flight 3.0" in r.read().decode():
                    break
            time.sleep(0.02)
        else:
            raise AssertionError("the requests were never in flight together")
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert proc.wait(120) == -signal.SIGTERM
        with pytest.raises(urllib.error.URLError):  # nothing listens any more
            _post(f"{url}/v1/completions", {"prompt": PROMPTS[0]})
    finally:
        if proc.poll() is None:
            proc.kill()
    model = elfreg.load(served_checkpoint, device="cpu")
    for k in range(3):
        status, body = answers[k]
        assert status == 200 and body["choices"][0]["text"] == model.generate(PROMPTS[k], seed=k, **settings)[0]
