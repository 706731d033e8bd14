"""``elfreg serve`` through the official ``openai`` client on loopback: the texts of ``generate``
for the same seed and settings (also among concurrent requests of other settings), chat,
streaming, ``n > 1``, overload, bad requests (400 naming the field), disconnects, shutdown."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_prompts import PROMPTS

openai = pytest.importorskip("openai", reason="the serving tests speak through the openai client (dev extra)")
uvicorn = pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")

from serve_http import Running, call, gauge, held, post, wait_for  # noqa: E402


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
    # the message written into a prompt as the toy checkpoint's training data wrote them: a newline after it
    assert running.model.prompt(PROMPTS[1]) == PROMPTS[1] + "\n"
    assert chat.choices[0].message.content == _texts(running.model, [PROMPTS[1] + "\n"], seed=1)[0]
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

    # all sixteen in flight before any samples, so that they share calls however slowly they come
    _, release = held(running)
    try:
        with ThreadPoolExecutor(16) as pool:
            asked = pool.map(ask, range(16))
            wait_for(lambda: gauge(running, "in_flight") == 16, "the sixteen requests admitted")
            release.set()
            texts = list(asked)
    finally:
        release.set()
        del running.server.run  # held no more
    merged = running.server.batcher.stats.calls - calls_before
    for k in range(16):
        assert texts[k] == _texts(running.model, [PROMPTS[k % 4]], seed=k, **settings[k])[0], settings[k]
    # the answers differ across prompts and seeds, so rows handed to the wrong request would show
    assert len(set(texts)) >= 8
    solo_calls = sum(s["nfe"] for s in settings)  # one call per NFE for a request alone
    assert merged < solo_calls  # calls were shared


BAD = [
    ({"prompt": "x", "temperature": 0.7}, "temperature"),
    ({"prompt": "x", "top_p": 0.9}, "top_p"),
    ({"prompt": "x", "logprobs": 2}, "logprobs"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
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
    ({"prompt": "x", "readouts": 2, "trim": True, "stream": True}, "readouts"),
    ({"prompt": "x", "readouts": 2}, "readouts"),  # readouts are streamed
    ({"prompt": "x", "nfe": 10**7}, "nfe"),
    ({"prompt": ["x"] * 65, "n": 16}, "prompt"),
    ({"prompt": "x", "n": 65}, "n"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
]


@pytest.mark.parametrize("body, field", BAD, ids=[f for _, f in BAD])
def test_a_bad_field_is_a_400_naming_it(running, body, field):
    r = post(running.url, "/v1/completions", {"model": "tiny", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"] and "\n" not in error["message"]


def test_health_and_metrics(running):
    assert call(running.url, path="/health").json() == {"status": "ok"}
    running.client.completions.create(model="tiny", prompt=PROMPTS[0])
    text = running.metrics()
    for name in ("elfreg_requests_total", "elfreg_requests_in_flight", "elfreg_load_in_flight", "elfreg_queued_calls",
                 "elfreg_network_calls_total", "elfreg_network_seconds_total", "elfreg_rows_per_call_bucket",
                 "elfreg_request_latency_seconds_bucket", "elfreg_network_retried_calls_total"):
        assert name in text, name
    assert 'elfreg_requests_total{route="/v1/completions",status="200"}' in text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line and not line.startswith("#") and "{" not in line}
    stats = running.server.batcher.stats  # the counters are the scheduler's own totals
    assert values["elfreg_network_calls_total"] == stats.calls > 0
    assert values["elfreg_network_seconds_total"] == pytest.approx(stats.seconds) and stats.seconds > 0


def test_a_full_queue_answers_429_at_once_and_a_disconnect_cancels(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_queue=1)
    entered, release = held(r)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(r.client.completions.create, model="tiny", prompt=PROMPTS[0])
            assert entered.wait(60)
            # refused while the one admitted request is still held: the 429 waited for nothing
            with pytest.raises(openai.RateLimitError):
                r.client.completions.create(model="tiny", prompt=PROMPTS[1])
            assert not first.done()
            release.set()
            assert first.result(60).choices[0].text == _texts(r.model, [PROMPTS[0]])[0]
        # a client that gives up while its request is held: answered 499 at once, and its
        # sampling stops before its first network call once let go
        entered.clear()
        release.clear()
        calls = r.server.batcher.stats.calls
        with pytest.raises(TimeoutError):
            post(r.url, "/v1/completions", {"prompt": PROMPTS[0]}, timeout=0.5)
        wait_for(lambda: 'status="499"} 1.0' in r.metrics(), "the 499 counted")
        assert gauge(r, "in_flight") == 1  # admitted until its sampling stops
        release.set()
        wait_for(lambda: gauge(r, "in_flight") == 0, "the cancelled request let go")
        assert r.server.batcher.stats.calls == calls and gauge(r, "load") == 0
        assert r.client.completions.create(model="tiny", prompt=PROMPTS[2]).choices[0].text == \
            _texts(r.model, [PROMPTS[2]])[0]
    finally:
        release.set()
        r.stop()


def test_a_request_that_arrives_while_the_server_stops_is_answered_503(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_queue=4)
    try:
        r.server.batcher.close()  # as at the end of a drain, with the HTTP side still up
        reply = post(r.url, "/v1/completions", {"prompt": PROMPTS[0]})
        assert reply.status_code == 503 and reply.json()["error"]["type"] == "unavailable"
        assert gauge(r, "in_flight") == 0  # its admission was given back
    finally:
        r.stop()
