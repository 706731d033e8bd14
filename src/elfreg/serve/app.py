"""``elfreg serve``'s application: an OpenAI-compatible HTTP API on FastAPI, every request
sampled through one :class:`~elfreg.serve.batcher.BatchedNetwork`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text).

Contract:

- a request's answer is :func:`elfreg.sampling.generate`'s for the same prompts, seed and
  settings: each request runs ``generate`` on the checkpoint's own frozen encoder and settings,
  as a job of the shared batched network (on its scheduler's thread);
- at most ``max_queue`` requests are admitted at once; one more is answered 429 at once;
- a bad field is answered 400 with one line naming it (OpenAI's error object); no input yields
  a 500;
- a client that disconnects has its request cancelled before its next network call;
- the process stops taking requests on SIGTERM and finishes those in flight (uvicorn's graceful
  shutdown, bounded by ``elfreg serve --graceful-timeout``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..config import ConfigError, SampleConfig
from ..device import use_bf16
from ..sampling import GenerationResult, generate
from ..sampling.network import StudentNetwork
from ..text.templates import get_template, render_prompt
from .batcher import BatchedNetwork, RequestCancelled
from .model import Model
from .protocol import BadRequest, ChatRequest, Choice, CompletionRequest, cut_answer, error_body


@dataclass
class ServeSettings:
    """How the server batches and admits work."""

    max_batch: int = 32  # rows per network call
    max_queue: int = 64  # requests admitted at once (running or waiting)
    model_name: str = "elfreg"
    # the batcher's scheduler in a thread of its own; False: the owner runs server.batcher.run()
    # on the thread that loaded the model (elfreg.serve.threads.serve_here, as `elfreg serve` does)
    batcher_thread: bool = True


# bounds that keep one request from taking the server's memory: the master grid (nfe × rho points
# per sample) and the rows of one request (prompts × n)
MAX_GRID_POINTS = 1 << 20
MAX_ROWS = 1024


class Metrics:
    """The Prometheus metrics of one server (its own registry)."""

    def __init__(self, batcher_state: Callable[[], tuple[int, int]]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("elfreg_requests", "requests answered, by route and status", ["route", "status"],
                                registry=r)
        self.in_flight = Gauge("elfreg_requests_in_flight", "requests admitted and not yet answered", registry=r)
        Gauge("elfreg_queued_calls", "sampler calls waiting for the network", registry=r).set_function(
            lambda: batcher_state()[0])
        Gauge("elfreg_sampling_requests", "requests sampling (started, not yet answered by the sampler)",
              registry=r).set_function(lambda: batcher_state()[1])
        self.calls = Counter("elfreg_network_calls", "network calls made (rate: calls per second)", registry=r)
        self.busy = Counter("elfreg_network_seconds", "seconds spent in network calls (rate: the share of time "
                            "the network is busy)", registry=r)
        self.rows = Histogram("elfreg_rows_per_call", "rows of each network call", registry=r,
                              buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.latency = Histogram("elfreg_request_latency_seconds", "time from admission to answer", ["route"],
                                 registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))

    def on_call(self, rows: int, seconds: float) -> None:
        self.calls.inc()
        self.busy.inc(seconds)
        self.rows.observe(rows)


class Server:
    """The model, the batched network and the admission count."""

    def __init__(self, model: Model, settings: ServeSettings):
        self.model, self.settings = model, settings
        models = model.models
        device = next(models.student.parameters()).device
        eos = models.frozen.tokenizer.eos_token_id
        # the network generate() would build for this checkpoint, shared by every request
        student_net = StudentNetwork(models.student, use_bf16(device, models.precision), eos_id=eos)
        self.metrics = Metrics(lambda: (self.batcher.queued_calls, self.batcher.active_jobs))
        self.batcher = BatchedNetwork(student_net, settings.max_batch, self.metrics.on_call,
                                      own_thread=settings.batcher_thread)
        self._admitted = 0
        self._lock = threading.Lock()
        self._encode_lock = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once

    def admit(self) -> bool:
        with self._lock:
            if self._admitted >= self.settings.max_queue:
                return False
            self._admitted += 1
            self.metrics.in_flight.inc()
            return True

    def release(self) -> None:
        with self._lock:
            self._admitted -= 1
            self.metrics.in_flight.dec()

    def settings_for(self, req: CompletionRequest | ChatRequest) -> SampleConfig:
        try:
            sample = self.model.settings_with(**req.sample_changes())
        except ConfigError as err:
            key = re.match(r"config error: sample\.(\w+):", str(err))  # the field SampleConfig names
            raise BadRequest(str(err).removeprefix("config error: "), key and key.group(1)) from None
        if sample.nfe * sample.rho > MAX_GRID_POINTS:
            raise BadRequest(f"nfe: nfe × rho = {sample.nfe * sample.rho} grid points; this server allows at most "
                             f"{MAX_GRID_POINTS}", "nfe")
        if sample.trim and req.readouts:
            raise BadRequest("readouts: a trimmed canvas records no readouts; drop trim or readouts", "readouts")
        if self.model.models.student.cfg.cfg_tokens == 0 and sample.sc_cfg != 1.0:
            raise BadRequest(f"sc_cfg: this model has no SC-CFG tokens, so sc_cfg must be 1, not {sample.sc_cfg}",
                             "sc_cfg")
        return sample

    def start(self, prompts: list[str], sample: SampleConfig, req: CompletionRequest | ChatRequest,
              cancel: threading.Event) -> Future:
        """Submit one request to the batched network; its future holds :meth:`run`'s results."""
        return self.batcher.submit(lambda _net: self.run(prompts, sample, req, cancel), cancel)

    def run(self, prompts: list[str], sample: SampleConfig, req: CompletionRequest | ChatRequest,
            cancel: threading.Event) -> list[GenerationResult]:
        """``generate`` for one request, through the batched network (a job of it)."""
        models = self.model.models
        # the tokenizer is shared with the HTTP thread (usage counts, stops), and a fast tokenizer
        # fails with "Already borrowed" when two threads use it at once
        frozen = dataclasses.replace(models.frozen,
                                     canvas=_Serialised(models.frozen.canvas, self._encode_lock, ("build",)))
        return generate(self.batcher, prompts, sample, frozen_text=frozen, flow=models.config.flow,
                        samples=req.n, seed=req.seed, batch_size=self.settings.max_batch,
                        record_every=req.readouts, progress=False)

    def choices(self, results: list[GenerationResult], req: CompletionRequest | ChatRequest) -> list[Choice]:
        tok = self.model.models.frozen.tokenizer

        def decode(tokens: list[int]) -> str:
            return tok.decode(tokens, skip_special_tokens=True)

        def encode(text: str) -> list[int]:
            with self._encode_lock:
                return tok.encode(text, add_special_tokens=False)

        stops = req.stops()
        out = []
        for k, r in enumerate(results):
            text, count, finish = cut_answer(r.text, r.tokens, r.ended, req.max_tokens, stops, decode, encode)
            out.append(Choice(index=k, text=text, finish_reason=finish, completion_tokens=count, nfe=r.nfe,
                              seed=r.seed))
        return out

    def prompt_tokens(self, prompts: list[str]) -> int:
        with self._encode_lock:
            return sum(len(self.model.models.frozen.tokenizer.encode(p, add_special_tokens=False)) for p in prompts)

    def close(self) -> None:
        self.batcher.close()


class _Serialised:
    """``target`` with the methods named in ``methods`` called one thread at a time."""

    def __init__(self, target: Any, lock: threading.Lock, methods: tuple[str, ...]):
        self._target, self._lock, self._methods = target, lock, methods

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name not in self._methods:
            return value

        def serialised(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return value(*args, **kwargs)
        return serialised


def _param_of(err: RequestValidationError) -> tuple[str, str | None]:
    """One line naming the first bad field of a request, and that field."""
    first = err.errors()[0]
    where = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = where[0] if where else None
    name = ".".join(where) or "body"
    if first.get("type") == "extra_forbidden":
        return f"{name}: unknown field (not an OpenAI field this server honours, nor a sampler setting)", field
    return f"{name}: {first.get('msg', 'invalid')}", field


def create_app(server: Server) -> FastAPI:
    """The HTTP application around ``server`` (module docstring)."""
    app = FastAPI(title="elfreg", docs_url=None, redoc_url=None)
    app.state.server = server

    @app.exception_handler(RequestValidationError)
    async def bad_field(request: Request, err: RequestValidationError) -> JSONResponse:
        message, field = _param_of(err)
        server.metrics.requests.labels(request.url.path, "400").inc()
        return JSONResponse(error_body(message, field), status_code=400)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, err: BadRequest) -> JSONResponse:
        server.metrics.requests.labels(request.url.path, "400").inc()
        return JSONResponse(error_body(str(err), err.param), status_code=400)

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
    async def completions(req: CompletionRequest, request: Request) -> Any:
        return await _answer(server, request, req, req.prompts(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        template = get_template(server.model.models.config.data.template)
        if len(template.fields) != 1:
            raise BadRequest(f"messages: this checkpoint's prompt template ({template.name}) needs the fields "
                             f"{', '.join(template.fields)}; send the whole prompt to /v1/completions", "messages")
        prompt = render_prompt(template.prompt, {template.main_field: req.question()})
        return await _answer(server, request, req, [prompt], chat=True)

    return app


async def _answer(server: Server, request: Request, req: CompletionRequest | ChatRequest, prompts: list[str],
                  chat: bool) -> Any:
    route = request.url.path
    req.stops()  # a bad stop is refused before any work
    if len(prompts) * req.n > MAX_ROWS:
        raise BadRequest(f"prompt: {len(prompts)} prompts × n = {req.n} is more than {MAX_ROWS} answers", "prompt")
    if req.model is not None and req.model != server.settings.model_name:
        raise BadRequest(f"model: this server serves {server.settings.model_name!r}, not {req.model!r}", "model")
    sample = server.settings_for(req)
    if not server.admit():
        server.metrics.requests.labels(route, "429").inc()
        return JSONResponse(error_body(f"the server is at its limit of {server.settings.max_queue} requests; "
                                       "retry later", kind="rate_limit_error"), status_code=429)
    started = time.monotonic()
    cancel = threading.Event()
    loop = asyncio.get_running_loop()
    try:
        started_job = server.start(prompts, sample, req, cancel)
    except RuntimeError:  # the batched network is closed: the server is stopping
        server.release()
        server.metrics.requests.labels(route, "503").inc()
        return JSONResponse(error_body("the server is shutting down", kind="unavailable"), status_code=503)
    released = False

    def done() -> None:
        nonlocal released
        if not released:
            released = True
            server.release()
            server.metrics.latency.labels(route).observe(time.monotonic() - started)

    started_job.add_done_callback(lambda _f: loop.call_soon_threadsafe(done))
    try:
        results = await _unless_disconnected(asyncio.wrap_future(started_job), request, cancel)
    except (ValueError, ConfigError) as err:  # generate refused the request's settings
        server.metrics.requests.labels(route, "400").inc()
        return JSONResponse(error_body(" ".join(str(err).split())), status_code=400)
    except RequestCancelled:
        server.metrics.requests.labels(route, "499").inc()
        return JSONResponse(error_body("the client went away", kind="cancelled"), status_code=499)
    body = _body(server, req, prompts, results, sample, chat)
    server.metrics.requests.labels(route, "200").inc()
    if not req.stream:
        return body
    return StreamingResponse(_events(body, results, req, chat, server), media_type="text/event-stream")


async def _unless_disconnected(future: asyncio.Future, request: Request, cancel: threading.Event) -> Any:
    """The worker's result; a client gone before it is ready cancels the request."""
    while True:
        done, _ = await asyncio.wait({future}, timeout=0.1)
        if done:
            return future.result()
        if await request.is_disconnected():
            cancel.set()
            try:
                await future
            except RequestCancelled:
                pass
            raise RequestCancelled("the client went away")


def _body(server: Server, req: CompletionRequest | ChatRequest, prompts: list[str], results: list[GenerationResult],
          sample: SampleConfig, chat: bool) -> dict[str, Any]:
    choices = server.choices(results, req)
    completion_tokens = sum(c.completion_tokens for c in choices)
    prompt_tokens = server.prompt_tokens(prompts) * req.n
    if chat:
        listed = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                   "finish_reason": c.finish_reason, "logprobs": None} for c in choices]
    else:
        listed = [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
                  for c in choices]
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": server.settings.model_name, "choices": listed,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "elfreg": {"sample": dataclasses.asdict(sample), "seed": req.seed,
                       "choices": [{"index": c.index, "seed": c.seed, "nfe": c.nfe} for c in choices]}}


async def _events(body: dict[str, Any], results: list[GenerationResult], req: CompletionRequest | ChatRequest,
                  chat: bool, server: Server) -> AsyncIterator[str]:
    """OpenAI's server-sent events: per choice, the early readouts asked for (empty text, the
    readout under ``elfreg``), then its final text, then ``[DONE]``."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    tok = server.model.models.frozen.tokenizer

    def chunk(index: int, text: str, finish: str | None, extra: dict[str, Any] | None = None) -> str:
        if chat:
            choice = {"index": index, "delta": {"role": "assistant", "content": text} if text or finish is None
                      else {}, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
        event = {"id": body["id"], "object": kind, "created": body["created"], "model": body["model"],
                 "choices": [choice], **({"elfreg": extra} if extra else {})}
        return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"

    for k, r in enumerate(results):
        tr = r.trajectory
        for s in range(0 if tr is None else len(tr.steps)):
            ids = tr.tokens[s].tolist()
            ids = ids[:ids.index(tok.eos_token_id)] if tok.eos_token_id in ids else ids
            yield chunk(k, "", None, {"readout": {"step": int(tr.steps[s]), "t": float(tr.times[s]),
                                                  "text": tok.decode(ids, skip_special_tokens=True)}})
        final = body["choices"][k]
        yield chunk(k, final["message"]["content"] if chat else final["text"], final["finish_reason"])
    yield "data: [DONE]\n\n"
