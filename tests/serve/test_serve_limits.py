"""What one request may cost ``elfreg serve``: per-request limits refused at once (400 naming the
limit), prompts past the canvas refused as OpenAI refuses them, admission by cost, the deadline,
the body limit checked before the body is read, keep-alives while a stream samples, and a
streaming client that goes away. Every ordering here is made by holding the scheduler (a
request's sampling waits for an event), never by sleeping."""

from __future__ import annotations

import http.client
import json

import pytest
from serve_prompts import PROMPTS

pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")
openai = pytest.importorskip("openai", reason="the serving tests speak through the openai client (dev extra)")

from serve_http import Running, answer, call, gauge, held, post, raw, read_reply, send, wait_for  # noqa: E402

from elfreg.serve.limits import ServeSettings, recorded_steps  # noqa: E402


def test_settings_that_could_never_admit_a_request_within_the_limits_are_refused():
    with pytest.raises(ValueError, match=r"--max-load \(100\) must be at least --max-rows × --max-nfe \(1024"):
        ServeSettings(max_load=100, max_rows=4, max_nfe=256).validate()
    with pytest.raises(ValueError, match="--request-timeout must be > 0"):
        ServeSettings(request_timeout=0).validate()
    assert recorded_steps(8, 2) == 4 and recorded_steps(8, 3) == 3 and recorded_steps(8, 100) == 2


def test_elfreg_serve_refuses_its_settings_before_it_loads_anything(tmp_path, capsys):
    from elfreg.cli import main

    assert main(["serve", "--checkpoint", str(tmp_path / "not-yet"), "--max-load", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--max-load (10) must be at least --max-rows × --max-nfe" in err and len(err.splitlines()) == 1


def test_a_request_over_a_limit_is_refused_at_once_naming_the_limit(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_nfe=16, max_grid_points=64, max_rows=4, max_readout_steps=6)
    entered, release = held(r)
    conn = send(r.url, {"prompt": PROMPTS[0]})
    try:
        assert entered.wait(60)  # the scheduler is busy until released: nothing below may wait for it
        refused = [({"nfe": 1_000_000}, "nfe", "--max-nfe"),
                   ({"nfe": 16, "rho": 8}, "rho", "--max-grid-points"),
                   ({"n": 5}, "n", "--max-rows"),
                   ({"n": 3, "prompt_cfg": 2.0}, "n", "× 2 (prompt CFG) is 6 rows"),
                   ({"prompt": PROMPTS[:3], "n": 2}, "prompt", "--max-rows"),
                   ({"stream": True, "readouts": 1, "nfe": 8}, "readouts", "--max-readout-steps")]
        for body, field, limit in refused:
            reply = post(r.url, "/v1/completions", {"prompt": PROMPTS[1], **body})
            error = reply.json()["error"]
            assert reply.status_code == 400 and error["param"] == field and limit in error["message"], reply.text
        assert gauge(r, "in_flight") == 1  # none of them was admitted
        release.set()
        assert answer(conn)["choices"][0]["text"] == r.model.generate(PROMPTS[:1])[0]
        # within every limit: a stream of readouts that records 4 steps (of 7, every second one)
        events = list(r.client.completions.create(model="tiny", prompt=PROMPTS[1], stream=True,
                                                  extra_body={"nfe": 8, "readouts": 2}))
        assert len(events) == 5
    finally:
        release.set()
        conn.close()
        r.stop()


def test_a_prompt_past_the_canvas_is_refused_as_openai_refuses_it_and_usage_counts_what_the_model_read(running):
    cap = running.model.models.frozen.canvas.prompt_cap  # 48; one token a character
    with pytest.raises(openai.BadRequestError) as refused:
        running.client.completions.create(model="tiny", prompt="x" * (cap + 1))
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "prompt"
    assert f"maximum context length is 64 tokens, of which a prompt may take {cap}; your prompt has {cap + 1}" in \
        refused.value.message
    out = running.client.completions.create(model="tiny", prompt="1" * cap, n=2)
    assert out.usage.prompt_tokens == 2 * cap
    assert [c.text for c in out.choices] == running.model.generate(["1" * cap], samples=2)
    with pytest.raises(openai.BadRequestError) as chat:
        running.client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "s" * cap},
                                                                       {"role": "user", "content": "hi"}])
    assert chat.value.code == "context_length_exceeded" and chat.value.param == "messages"



def test_admission_is_by_cost_so_small_requests_pass_large_ones(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_rows=4, max_nfe=8, max_load=40, max_queue=8)
    entered, release = held(r)
    large = {"prompt": PROMPTS[0], "n": 4, "nfe": 8}  # 4 rows × 8 calls = 32 row-calls
    small = {"prompt": PROMPTS[1], "nfe": 8}  # 8 row-calls
    first = send(r.url, large)
    second = None
    try:
        assert entered.wait(60)
        assert post(r.url, "/v1/completions", large).status_code == 429  # 32 + 32 > 40
        second = send(r.url, small)
        wait_for(lambda: gauge(r, "in_flight") == 2, "the small request admitted beside the large one")
        assert gauge(r, "load") == 40
        busy = post(r.url, "/v1/completions", small)  # 40 + 8 > 40
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "rate_limit_error"
        release.set()
        texts = [answer(c)["choices"] for c in (first, second)]
        assert [c["text"] for c in texts[0]] == r.model.generate(PROMPTS[:1], samples=4, nfe=8)
        assert texts[1][0]["text"] == r.model.generate(PROMPTS[1:2], nfe=8)[0]
        wait_for(lambda: gauge(r, "load") == 0 and gauge(r, "in_flight") == 0, "the admitted work given back")
    finally:
        release.set()
        first.close()
        if second is not None:
            second.close()
        r.stop()


def test_a_request_past_its_deadline_is_answered_408_and_stops_before_the_network(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, request_timeout=0.3)
    entered, release = held(r)
    try:
        calls = r.server.batcher.stats.calls
        reply = post(r.url, "/v1/completions", {"prompt": PROMPTS[0]})  # held past its deadline
        assert reply.status_code == 408 and reply.json()["error"]["type"] == "timeout_error", reply.text
        assert "--request-timeout" in reply.json()["error"]["message"]
        assert entered.wait(60)  # its sampling started (and waits), now or before the deadline
        events = call(r.url, "POST", "/v1/completions", json.dumps({"prompt": PROMPTS[1], "stream": True}).encode())
        assert events.status_code == 200  # a stream's 200 went out first: its failure is an error event
        last = events.text.strip().splitlines()[-1]
        assert json.loads(last.removeprefix("data: "))["error"]["type"] == "timeout_error"
        assert gauge(r, "in_flight") == 2  # admitted until their sampling stops
        release.set()
        wait_for(lambda: gauge(r, "in_flight") == 0, "the timed-out requests let go")
        assert r.server.batcher.stats.calls == calls  # neither reached the network
        assert 'elfreg_requests_total{route="/v1/completions",status="408"} 2.0' in r.metrics()
    finally:
        release.set()
        r.stop()


def test_a_body_past_the_limit_is_refused_before_it_is_read_while_health_answers(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, max_body_bytes=1 << 20)
    declared, chunked = raw(r.url), raw(r.url)
    try:
        # 20 MB declared, 64 kB sent: the answer comes though the rest of the body never does,
        # and the server answers others while that upload is still open
        declared.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\ncontent-type: application/json\r\n"
                         b"content-length: 20000000\r\n\r\n" + b'{"prompt": "' + b"x" * 65536)
        reply = read_reply(declared)
        assert reply.status_code == 413 and "--max-body-bytes" in reply.json()["error"]["message"]
        assert call(r.url, path="/health").json() == {"status": "ok"}
        # no length declared: refused once the bytes read pass the limit, before the body ends
        chunked.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\ncontent-type: application/json\r\n"
                        b"transfer-encoding: chunked\r\n\r\n")
        piece = b"x" * (256 << 10)
        for _ in range(5):  # 1.25 MB, and no last chunk
            chunked.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        reply = read_reply(chunked)
        assert reply.status_code == 413 and reply.json()["error"]["type"] == "invalid_request_error"
        assert 'elfreg_requests_total{route="/v1/completions",status="413"} 2.0' in r.metrics()
        assert r.client.completions.create(model="tiny", prompt=PROMPTS[0]).choices[0].text == \
            r.model.generate(PROMPTS[:1])[0]
    finally:
        declared.close()
        chunked.close()
        r.stop()


def _stream_lines(r: Running, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(r.url.removeprefix("http://"), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), {"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    return conn, response


def test_a_stream_sends_keep_alives_while_it_samples_and_a_client_that_leaves_stops_it(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8, keepalive=0.05)
    entered, release = held(r)
    try:
        conn, response = _stream_lines(r, {"prompt": PROMPTS[2], "seed": 4})
        lines = [response.readline() for _ in range(6)]  # three comments, each with its blank line
        assert lines == [b": keep-alive\n", b"\n"] * 3  # while its sampling waits to be released
        assert entered.wait(60)
        release.set()
        rest = response.read().decode()
        data = [json.loads(line.removeprefix("data: ")) for line in rest.splitlines()
                if line.startswith("data: {")]
        assert data[-1]["choices"][0]["text"] == r.model.generate(PROMPTS[2:3], seed=4)[0]
        assert rest.rstrip().endswith("data: [DONE]")
        conn.close()
        # a streaming client that goes away while its request samples: its sampling stops
        release.clear()
        entered.clear()
        calls = r.server.batcher.stats.calls
        conn, response = _stream_lines(r, {"prompt": PROMPTS[3]})
        assert response.readline() == b": keep-alive\n"
        conn.close()
        response.close()
        wait_for(lambda: 'status="499"} 1.0' in r.metrics(), "the stream's client counted as gone")
        release.set()
        wait_for(lambda: gauge(r, "in_flight") == 0, "the abandoned stream let go")
        assert r.server.batcher.stats.calls == calls
    finally:
        release.set()
        r.stop()
