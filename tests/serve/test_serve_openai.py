"""``elfreg serve`` through the official ``openai`` client on loopback: the texts of ``generate``
for the same seed and settings (also among concurrent requests of other settings), chat,
streaming, ``n > 1``, overload, bad requests (400 naming the field, never 500), disconnects."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_prompts import PROMPTS

openai = pytest.importorskip("openai", reason="the serving tests speak through the openai client (dev extra)")
uvicorn = pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")

import elfreg  # noqa: E402
from elfreg.serve.app import Server, ServeSettings, create_app  # noqa: E402


class Reply:
    def __init__(self, status: int, text: str):
        self.status_code, self.text = status, text

    def json(self):
        return json.loads(self.text)


def _http(url: str, method: str = "GET", path: str = "/", body: bytes | None = None, timeout: float = 60) -> Reply:
    """One plain HTTP request (the bad-input tests send what no client library would)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"} if body is not None else {})
        r = conn.getresponse()
        return Reply(r.status, r.read().decode())
    finally:
        conn.close()


def _post(url: str, path: str, payload: object, timeout: float = 60) -> Reply:
    return _http(url, "POST", path, json.dumps(payload).encode(), timeout)


class Running:
    """A server on a free loopback port, in a thread."""

    def __init__(self, checkpoint, **settings):
        self.model = elfreg.load(checkpoint, device="cpu")
        self.server = Server(self.model, ServeSettings(model_name="tiny", **settings))
        self.web = uvicorn.Server(uvicorn.Config(create_app(self.server), host="127.0.0.1", port=0,
                                                 log_level="warning"))
        self.thread = threading.Thread(target=self.web.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.web.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        port = self.web.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self) -> None:
        self.web.should_exit = True
        self.thread.join(30)
        self.server.close()


@pytest.fixture(scope="module")
def running(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_queue=32)
    yield r
    r.stop()


def _texts(model, prompts, n=1, seed=0, **settings):
    return model.generate(prompts, samples=n, seed=seed, **settings)


def test_completions_and_chat_give_generates_texts(running):
    out = running.client.completions.create(model="tiny", prompt=PROMPTS[0], seed=3, n=2,
                                            extra_body={"nfe": 6, "sampler": "full-span"})
    assert [c.text for c in out.choices] == _texts(running.model, [PROMPTS[0]], n=2, seed=3, nfe=6,
                                                   sampler="full-span")
    assert [c.index for c in out.choices] == [0, 1] and out.object == "text_completion" and out.model == "tiny"
    extra = out.model_extra["elfreg"]
    assert [c["seed"] for c in extra["choices"]] == [3, 4] and all(c["nfe"] == 6 for c in extra["choices"])
    assert out.usage.completion_tokens > 0 and out.usage.total_tokens == out.usage.prompt_tokens + \
        out.usage.completion_tokens
    # several prompts: prompt-major choices, sample j of each with seed + j
    many = running.client.completions.create(model="tiny", prompt=PROMPTS[:3], n=2)
    assert [c.text for c in many.choices] == _texts(running.model, PROMPTS[:3], n=2)
    chat = running.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[1]}],
                                                  seed=1)
    # the toy checkpoint's template is raw: the message is the prompt
    assert chat.choices[0].message.content == _texts(running.model, [PROMPTS[1]], seed=1)[0]
    assert chat.choices[0].message.role == "assistant" and chat.object == "chat.completion"
    assert [m.id for m in running.client.models.list().data] == ["tiny"]


def test_max_tokens_and_stop_cut_the_answer(running):
    full = _texts(running.model, [PROMPTS[2]])[0]
    cut = running.client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=3)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3
    assert full.startswith(cut.choices[0].text) and len(cut.choices[0].text) < len(full)
    stop = full[len(full) // 2]
    stopped = running.client.completions.create(model="tiny", prompt=PROMPTS[2], stop=[stop])
    assert stopped.choices[0].text == full[:full.index(stop)] and stopped.choices[0].finish_reason == "stop"


def test_streaming_sends_readouts_then_the_final_text(running):
    events = list(running.client.completions.create(model="tiny", prompt=PROMPTS[0], stream=True,
                                                    extra_body={"nfe": 8, "readouts": 2}))
    finals = [e for e in events if e.choices[0].finish_reason is not None]
    readouts = [e.model_extra["elfreg"]["readout"] for e in events if e.choices[0].finish_reason is None]
    assert len(finals) == 1 and finals[0].choices[0].text == _texts(running.model, [PROMPTS[0]], nfe=8)[0]
    assert [r["step"] for r in readouts] == [0, 2, 4, 6] and all(e.choices[0].text == "" for e in events[:-1])
    assert "".join(e.choices[0].text for e in events) == finals[0].choices[0].text  # deltas add up
    chat = list(running.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPTS[3]}], stream=True))
    assert "".join(e.choices[0].delta.content or "" for e in chat) == _texts(running.model, [PROMPTS[3]])[0]


def test_sixteen_concurrent_requests_of_other_settings_equal_their_solo_runs(running):
    settings = [{"nfe": nfe, "sampler": sampler, "sc_cfg": w}
                for nfe in (4, 6, 8, 12) for sampler, w in (("early-stop", 1.0), ("full-span", 2.0),
                                                            ("renoise", 1.0), ("early-stop", 3.0))]
    calls_before = running.server.batcher.stats.calls

    def ask(k: int) -> str:
        out = running.client.completions.create(model="tiny", prompt=PROMPTS[k % 4], seed=k,
                                                extra_body=settings[k])
        return out.choices[0].text

    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(ask, range(16)))
    merged = running.server.batcher.stats.calls - calls_before
    for k in range(16):
        assert texts[k] == _texts(running.model, [PROMPTS[k % 4]], seed=k, **settings[k])[0], settings[k]
    solo_calls = sum(s["nfe"] for s in settings)  # one call per NFE for a request alone
    assert merged < solo_calls  # calls were shared


BAD = [
    ({"prompt": "x", "temperature": 0.7}, "temperature"),
    ({"prompt": "x", "nfe": 1}, "nfe"),
    ({"prompt": "x", "nfe": "many"}, "nfe"),
    ({"prompt": "x", "sampler": "greedy"}, "sampler"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": []}, "prompt"),
    ({"prompt": 42}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "model": "gpt-4"}, "model"),
    ({"prompt": "x", "sc_cfg": -2}, "sc_cfg"),
    ({"prompt": "x", "readouts": -1}, "readouts"),
    ({"prompt": "x", "readouts": 2, "trim": True}, "readouts"),
    ({"prompt": "x", "nfe": 10**7}, "nfe"),
    ({"prompt": ["x"] * 65, "n": 16}, "prompt"),
]


@pytest.mark.parametrize("body, field", BAD, ids=[f for _, f in BAD])
def test_a_bad_field_is_a_400_naming_it(running, body, field):
    r = _post(running.url, "/v1/completions", {"model": "tiny", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"] and "\n" not in error["message"]


def test_no_input_makes_a_500(running):
    bodies = [b"", b"not json", b"[]", b'{"prompt": null}', json.dumps({"messages": []}).encode(),
              json.dumps({"prompt": "x" * 5000}).encode(), json.dumps({"prompt": "\udcff"}, ensure_ascii=True).encode()]
    for path in ("/v1/completions", "/v1/chat/completions"):
        for body in bodies:
            r = _http(running.url, "POST", path, body)
            assert r.status_code < 500, (path, body[:40], r.text)
    r = _post(running.url, "/v1/chat/completions", {"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "exactly one user message" in r.json()["error"]["message"]


def test_health_and_metrics(running):
    assert _http(running.url, path="/health").json() == {"status": "ok"}
    running.client.completions.create(model="tiny", prompt=PROMPTS[0])
    text = _http(running.url, path="/metrics").text
    for name in ("elfreg_requests_total", "elfreg_requests_in_flight", "elfreg_queued_calls",
                 "elfreg_network_calls_total", "elfreg_network_seconds_total", "elfreg_rows_per_call_bucket",
                 "elfreg_request_latency_seconds_bucket"):
        assert name in text, name
    assert 'elfreg_requests_total{route="/v1/completions",status="200"}' in text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line and not line.startswith("#") and "{" not in line}
    stats = running.server.batcher.stats  # the counters are the scheduler's own totals
    assert values["elfreg_network_calls_total"] == stats.calls > 0
    assert values["elfreg_network_seconds_total"] == pytest.approx(stats.seconds) and stats.seconds > 0


def test_a_full_queue_answers_429_at_once_and_a_disconnect_cancels(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_queue=1)
    release = threading.Event()
    original = r.server.run

    def slow_run(*args):  # hold the one admitted request until told
        release.wait(60)
        return original(*args)

    r.server.run = slow_run
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(r.client.completions.create, model="tiny", prompt=PROMPTS[0])
            time.sleep(0.3)
            t0 = time.monotonic()
            with pytest.raises(openai.RateLimitError):
                r.client.completions.create(model="tiny", prompt=PROMPTS[1])
            assert time.monotonic() - t0 < 5
            release.set()
            assert first.result(60).choices[0].text == _texts(r.model, [PROMPTS[0]])[0]
        # a client that gives up: its request is cancelled and the server stays usable
        release.clear()
        with pytest.raises((TimeoutError, socket.timeout)):
            _post(r.url, "/v1/completions", {"prompt": PROMPTS[0]}, timeout=0.5)
        time.sleep(0.5)
        release.set()
        deadline = time.monotonic() + 30
        while r.server.metrics.in_flight._value.get() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.server.metrics.in_flight._value.get() == 0
        text = _http(r.url, path="/metrics").text
        assert 'elfreg_requests_total{route="/v1/completions",status="499"} 1.0' in text
        assert r.client.completions.create(model="tiny", prompt=PROMPTS[2]).choices[0].text == \
            _texts(r.model, [PROMPTS[2]])[0]
    finally:
        release.set()
        r.stop()


def test_a_request_that_arrives_while_the_server_stops_is_answered_503(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_queue=4)
    try:
        r.server.batcher.close()  # as at the end of a drain, with the HTTP side still up
        reply = _post(r.url, "/v1/completions", {"prompt": PROMPTS[0]})
        assert reply.status_code == 503 and reply.json()["error"]["type"] == "unavailable"
        assert r.server.metrics.in_flight._value.get() == 0  # its admission was given back
    finally:
        r.stop()
