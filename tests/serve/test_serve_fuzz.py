"""Hostile bodies against ``elfreg serve``: overflowing integers, non-finite floats, huge and
empty prompts, wrong types, deep nesting, invalid UTF-8, absurd ``nfe`` / ``n`` / ``readouts``,
unknown routes. None is answered 5xx; every error is OpenAI's error object in one line, counted
in the metrics; and the server answers a normal request as ``generate`` does afterwards."""

from __future__ import annotations

import json
import random

import pytest
from serve_prompts import PROMPTS

pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")
pytest.importorskip("openai", reason="the serving tests speak through the openai client (dev extra)")

from serve_http import Running, call, gauge  # noqa: E402


def _json(payload: object) -> bytes:
    return json.dumps(payload).encode()


BIG = 10**30
HOSTILE: list[tuple[str, bytes]] = [
    ("empty body", b""),
    ("not JSON", b"not json"),
    ("a list", b"[]"),
    ("null", b"null"),
    ("a string", b'"prompt"'),
    ("prompt null", b'{"prompt": null}'),
    ("nfe past int64", _json({"prompt": "x", "nfe": BIG})),
    ("adaptive_patience past int64", _json({"prompt": "x", "sampler": "adaptive", "adaptive_patience": BIG})),
    ("trim_patience past int64", _json({"prompt": "x", "trim": True, "trim_patience": BIG})),
    ("trim_margin past int64", _json({"prompt": "x", "trim": True, "trim_margin": BIG})),
    ("negative trim_margin past int64", _json({"prompt": "x", "trim": True, "trim_margin": -BIG})),
    ("sc_cfg 1e999 (infinite)", b'{"prompt": "x", "sc_cfg": 1e999}'),
    ("sc_cfg NaN", b'{"prompt": "x", "sc_cfg": NaN}'),
    ("renoise_eta -Infinity", b'{"prompt": "x", "sampler": "renoise", "renoise_eta": -Infinity}'),
    ("sc_cfg past float32", _json({"prompt": "x", "sc_cfg": 1e300})),
    ("a 5,000-digit seed", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}"),
    ("a 5,000-digit float", b'{"prompt": "x", "sc_cfg": 1.' + b"5" * 5000 + b"}"),
    ("deeply nested prompt", b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}"),
    ("deeply nested object", b'{"stop": ' + b'{"a": ' * 20000 + b"1" + b"}" * 20001),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe\xfd"}'),
    ("a lone surrogate", _json({"prompt": "\udcff"})),
    ("a huge prompt", _json({"prompt": "x" * 300_000})),
    ("an empty prompt", _json({"prompt": ""})),
    ("no prompts", _json({"prompt": []})),
    ("ten thousand prompts", _json({"prompt": ["x"] * 10_000})),
    ("nfe of the wrong type", _json({"prompt": "x", "nfe": "many"})),
    ("nfe 1000000", _json({"prompt": "x", "nfe": 1_000_000})),
    ("nfe 1", _json({"prompt": "x", "nfe": 1})),
    ("rho a million", _json({"prompt": "x", "rho": 1_000_000})),
    ("n a million", _json({"prompt": "x", "n": 1_000_000})),
    ("n negative", _json({"prompt": "x", "n": -1})),
    ("readouts a billion", _json({"prompt": "x", "stream": True, "readouts": 10**9})),
    ("readouts of every step of 64 answers", _json({"prompt": "x", "stream": True, "readouts": 1, "n": 64,
                                                    "nfe": 256})),
    ("readouts without a stream", _json({"prompt": "x", "readouts": 1})),
    ("max_tokens past int64", _json({"prompt": "x", "max_tokens": BIG})),
    ("a thousand stops", _json({"prompt": "x", "stop": ["a"] * 1000})),
    ("temperature as text", _json({"prompt": "x", "temperature": "hot"})),
    ("stream as text", _json({"prompt": "x", "stream": "maybe"})),
    ("seed past uint64", _json({"prompt": "x", "seed": 2**64})),
    ("an unknown field", _json({"prompt": "x", "beam_width": 4})),
    ("model as a list", _json({"prompt": "x", "model": ["tiny"]})),
    ("sampler as an object", _json({"prompt": "x", "sampler": {"name": "early-stop"}})),
]
CHAT_HOSTILE: list[tuple[str, bytes]] = [
    ("messages as text", _json({"messages": "hi"})),
    ("no messages", _json({"messages": []})),
    ("a message without content", _json({"messages": [{"role": "user"}]})),
    ("an image part", _json({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})),
    ("a conversation", _json({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                           {"role": "user", "content": "c"}]})),
    ("a system prompt past the canvas", _json({"messages": [{"role": "system", "content": "s" * 5000},
                                                            {"role": "user", "content": "hi"}]})),
    ("an unknown role", _json({"messages": [{"role": "wizard", "content": "hi"}]})),
    ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'),
]
FIELDS = ["nfe", "n", "rho", "sc_cfg", "prompt_cfg", "readouts", "max_tokens", "seed", "stop", "sampler", "trim",
          "trim_margin", "adaptive_interval", "renoise_power", "temperature", "top_p", "logprobs", "stream"]
VALUES = [BIG, -BIG, 1e308, -0.0, 0, -1, 2**31, 2**63, "", "x" * 1000, None, True, [], {}, [[[]]], 3.5, "early-stop"]


def _random_bodies(count: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """Seeded random mixes of the fields and values above."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        body = {"prompt": rng.choice(PROMPTS), **{f: rng.choice(VALUES) for f in rng.sample(FIELDS, rng.randint(1, 3))}}
        out.append((f"random {k}: {sorted(body)}", _json(body)))
    return out


def _openai_error(reply) -> None:
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, reply.text
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"], reply.text


def test_no_hostile_body_makes_a_5xx_every_error_is_openais_and_the_server_lives(served_checkpoint):
    r = Running(served_checkpoint, max_batch=8)
    try:
        sent = ([("/v1/completions", name, body) for name, body in HOSTILE + _random_bodies(30)]
                + [("/v1/chat/completions", name, body) for name, body in CHAT_HOSTILE + HOSTILE[:6]])
        refused = 0
        for path, name, body in sent:
            reply = call(r.url, "POST", path, body)
            assert reply.status_code < 500, (path, name, reply.text)
            if reply.status_code >= 400:
                _openai_error(reply)
                refused += 1
        assert refused >= 50  # nearly all of them are refused, each in OpenAI's shape
        # FastAPI's own refusals (an unknown route, a wrong method) are OpenAI's errors too
        for method, path, status in (("GET", "/v1/nothing", 404), ("POST", "/health", 405),
                                     ("GET", "/v1/completions", 405), ("DELETE", "/v1/models", 405)):
            reply = call(r.url, method, path, b"" if method != "GET" else None)
            assert reply.status_code == status and "detail" not in reply.json(), reply.text
            _openai_error(reply)
        text = r.metrics()
        counted = sum(float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith("elfreg_requests_total{"))
        assert counted == len(sent) + 4  # every answer counted once, whoever made it
        assert 'elfreg_requests_total{route="other",status="404"} 1.0' in text
        assert gauge(r, "in_flight") == 0 and gauge(r, "load") == 0
        out = r.client.completions.create(model="tiny", prompt=PROMPTS[1], seed=2)
        assert out.choices[0].text == r.model.generate([PROMPTS[1]], seed=2)[0]
    finally:
        r.stop()
