"""``elfreg serve``'s routes: an OpenAI-compatible HTTP API on FastAPI, every request sampled
through one :class:`~elfreg.serve.server.Server`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text).

Contract:

- a request is parsed and bounded (:func:`~elfreg.serve.protocol.parse_request`), its cost
  checked against the server's limits (:mod:`elfreg.serve.limits`) and its prompts against the
  canvas before any work; each refusal is a 400 with one line naming the field;
- a request that does not fit the admission limits is answered 429 at once;
- an admitted request not answered within ``request_timeout`` seconds is answered 408 and stops
  before its next network call; so does one whose client disconnects (counted as 499);
- a stream sends an SSE comment every ``keepalive`` seconds while its request samples (so that
  a proxy's read timeout does not cut it), then the events; a failure after its 200 went out is
  an ``{"error": ...}`` event;
- the errors of the HTTP side itself (body limit, unknown routes) are :mod:`elfreg.serve.guard`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..config import ConfigError, SampleConfig
from ..sampling import GenerationResult
from ..text.templates import prompt_for
from .batcher import NetworkClosed, RequestCancelled
from .guard import GONE, install
from .protocol import BadRequest, ChatRequest, CompletionRequest, error_body, parse_request
from .server import Request as ApiRequest
from .server import Server

POLL_S = 0.1  # how often a waiting request looks whether its client is still there


class _Failed(Exception):
    """A request that fails after admission: its status and OpenAI error object."""

    def __init__(self, status: int, body: dict[str, Any]):
        super().__init__(body["error"]["message"])
        self.status, self.body = status, body


def create_app(server: Server) -> FastAPI:
    """The HTTP application around ``server`` (module docstring)."""
    app = FastAPI(title="elfreg", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    install(app, server.settings.max_body_bytes, server.metrics)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "elfreg"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = parse_request(CompletionRequest, await request.body())
        return await _answer(server, request, req, req.prompts(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req = parse_request(ChatRequest, await request.body())
        try:
            prompt = prompt_for(server.model.models.config.data, req.question())
        except ValueError as err:
            raise BadRequest(f"messages: this checkpoint's {err}; send it to /v1/completions", "messages") from None
        return await _answer(server, request, req, [prompt], chat=True)

    return app


async def _answer(server: Server, request: Request, req: ApiRequest, prompts: list[str], chat: bool) -> Any:
    if req.model is not None and req.model != server.settings.model_name:
        raise BadRequest(f"model: this server serves {server.settings.model_name!r}, not {req.model!r}", "model")
    sample, cost = server.settings_for(req, len(prompts))
    # tokenising a long prompt takes a while: not on the event loop, which answers everyone
    prompt_tokens = await asyncio.to_thread(server.prompt_tokens, prompts, "messages" if chat else "prompt")
    if not server.admit(cost):
        return JSONResponse(error_body(f"the server is at its limit ({server.settings.max_queue} requests, "
                                       f"{server.settings.max_load} row-calls in flight); retry later",
                                       kind="rate_limit_error"), status_code=429)
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    deadline = loop.time() + server.settings.request_timeout
    cancel = threading.Event()
    try:
        job = server.start(prompts, sample, req, cancel)
    except NetworkClosed:  # the server is stopping
        server.release(cost)
        return JSONResponse(error_body("the server is shutting down", kind="unavailable"), status_code=503)

    def done() -> None:  # the work has stopped: give back what it was admitted with
        server.release(cost)
        server.metrics.latency.labels(request.url.path).observe(time.monotonic() - started)

    job.add_done_callback(lambda _f: loop.call_soon_threadsafe(done))
    waiting = _Waiting(job, request, cancel, deadline, server.settings.request_timeout)
    answer = _Answer(server, req, prompts, prompt_tokens * req.n, sample, chat)
    if req.stream:
        return StreamingResponse(_stream(waiting, answer, server.settings.keepalive),
                                 media_type="text/event-stream")
    try:
        results = await waiting.results(POLL_S)
    except _Failed as err:
        return JSONResponse(err.body, status_code=err.status)
    return answer.body(results)


class _Waiting:
    """The wait of one admitted request for its sampling: the deadline, the client's presence."""

    def __init__(self, job: Future, request: Request, cancel: threading.Event, deadline: float, timeout: float):
        self.job, self.request, self.cancel, self.deadline, self.timeout = job, request, cancel, deadline, timeout
        self.future = asyncio.wrap_future(job)
        self.future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: never logged

    async def settled(self, within: float) -> bool:
        """Whether the sampling is done, after waiting for it at most ``within`` seconds;
        :class:`_Failed` (408) once the deadline has passed."""
        left = self.deadline - asyncio.get_running_loop().time()
        if left <= 0:
            self.stop()
            raise _Failed(408, error_body(f"the request took longer than this server's limit of {self.timeout:g} s "
                                          "(elfreg serve --request-timeout)", kind="timeout_error"))
        done, _ = await asyncio.wait({self.future}, timeout=min(within, left))
        return bool(done)

    async def results(self, every: float) -> list[GenerationResult]:
        """The request's results; :class:`_Failed` when it fails, times out, or its client goes
        away (looked at every ``every`` seconds)."""
        while not await self.settled(every):
            if await self.request.is_disconnected():
                self.stop()
                raise _Failed(GONE, error_body("the client went away", kind="cancelled"))
        return _result(self.future)

    def stop(self) -> None:
        """Stop the request's sampling at its next network call (its future then fails)."""
        self.cancel.set()


def _result(future: asyncio.Future) -> list[GenerationResult]:
    try:
        return future.result()
    except RequestCancelled:
        raise _Failed(GONE, error_body("the client went away", kind="cancelled")) from None
    except NetworkClosed:
        raise _Failed(503, error_body("the server is shutting down", kind="unavailable")) from None
    except (ValueError, ConfigError) as err:  # generate refused the request's settings
        raise _Failed(400, error_body(" ".join(str(err).split()))) from None
    except Exception as err:  # noqa: BLE001 - the network failed on this request's own rows
        raise _Failed(500, error_body(f"sampling failed: {type(err).__name__}", kind="server_error")) from None


@dataclasses.dataclass
class _Answer:
    """What makes a request's answer from its results, in either format."""

    server: Server
    req: ApiRequest
    prompts: list[str]
    prompt_tokens: int
    sample: SampleConfig
    chat: bool

    def body(self, results: list[GenerationResult]) -> dict[str, Any]:
        choices = self.server.choices(results, self.req)
        completion_tokens = sum(c.completion_tokens for c in choices)
        if self.chat:
            listed = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                       "finish_reason": c.finish_reason, "logprobs": None} for c in choices]
        else:
            listed = [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
                      for c in choices]
        return {"id": f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion" if self.chat else "text_completion", "created": int(time.time()),
                "model": self.server.settings.model_name, "choices": listed,
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": self.prompt_tokens + completion_tokens},
                "elfreg": {"sample": dataclasses.asdict(self.sample), "seed": self.req.seed,
                           "choices": [{"index": c.index, "seed": c.seed, "nfe": c.nfe} for c in choices]}}

    def events(self, results: list[GenerationResult]) -> list[str]:
        """OpenAI's server-sent events: per choice, the early readouts asked for (empty text, the
        readout under ``elfreg``), then its final text; the usage chunk when asked for; ``[DONE]``."""
        body = self.body(results)
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        tok = self.server.model.models.frozen.tokenizer
        usage = {"usage": None} if self.req.include_usage else {}

        def chunk(index: int, text: str, finish: str | None, extra: dict[str, Any] | None = None) -> str:
            if self.chat:
                choice = {"index": index, "delta": {"role": "assistant", "content": text} if text or finish is None
                          else {}, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
            return _event({"id": body["id"], "object": kind, "created": body["created"], "model": body["model"],
                           "choices": [choice], **usage, **({"elfreg": extra} if extra else {})})

        out = []
        for k, r in enumerate(results):
            tr = r.trajectory
            for s in range(0 if tr is None else len(tr.steps)):
                ids = tr.tokens[s].tolist()
                ids = ids[:ids.index(tok.eos_token_id)] if tok.eos_token_id in ids else ids
                out.append(chunk(k, "", None, {"readout": {"step": int(tr.steps[s]), "t": float(tr.times[s]),
                                                           "text": tok.decode(ids, skip_special_tokens=True)}}))
            final = body["choices"][k]
            out.append(chunk(k, final["message"]["content"] if self.chat else final["text"], final["finish_reason"]))
        if self.req.include_usage:
            out.append(_event({"id": body["id"], "object": kind, "created": body["created"], "model": body["model"],
                               "choices": [], "usage": body["usage"]}))
        return out


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(waiting: _Waiting, answer: _Answer, keepalive: float) -> AsyncIterator[str]:
    """The events of a streamed request (module docstring). Starlette watches a streaming
    client itself and cancels this generator when it goes away; that stops its sampling."""
    failed = False
    try:
        while not await waiting.settled(keepalive):
            yield ": keep-alive\n\n"
        for event in answer.events(_result(waiting.future)):
            yield event
        yield "data: [DONE]\n\n"
    except _Failed as err:
        failed = True
        waiting.request.state.status = err.status
        yield _event(err.body)
    finally:
        if not waiting.job.done():  # failed, or its client went away, while it sampled
            waiting.stop()
            if not failed:
                waiting.request.state.status = GONE
