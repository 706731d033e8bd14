"""``elfreg serve``'s server side, apart from HTTP: the loaded model, the batched network every
request samples through, admission by cost, and a request's settings, prompts and answers.

Contract:

- a request's answer is :func:`elfreg.sampling.generate`'s for the same prompts, seed and
  settings: each request runs ``generate`` on the checkpoint's own frozen encoder and settings,
  as a job of the shared :class:`~elfreg.serve.batcher.BatchedNetwork`;
- admission (:meth:`Server.admit`) takes a request while fewer than ``max_queue`` requests are in
  flight and the row-calls in flight, its own included, stay within ``max_load``
  (:mod:`elfreg.serve.limits`); what a request admitted is given back when its sampling stops;
- a prompt longer than the canvas's prompt region (``text.prompt_cap``) is refused with OpenAI's
  ``context_length_exceeded``, never cut; ``usage.prompt_tokens`` counts the tokens the model read.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from concurrent.futures import Future
from typing import Any

from ..config import ConfigError, SampleConfig
from ..device import use_bf16
from ..sampling import GenerationResult, generate
from ..sampling.network import StudentNetwork
from ..text.canvas import token_ids
from .batcher import BatchedNetwork
from .limits import ServeSettings, check_cost
from .metrics import Metrics
from .model import Model
from .protocol import BadRequest, ChatRequest, Choice, CompletionRequest, cut_answer

Request = CompletionRequest | ChatRequest


class Server:
    """The model, the batched network and the admission count (module docstring)."""

    def __init__(self, model: Model, settings: ServeSettings):
        self.model, self.settings = model, settings.validate()
        models = model.models
        device = next(models.student.parameters()).device
        eos = models.frozen.tokenizer.eos_token_id
        # the network generate() would build for this checkpoint, shared by every request
        student_net = StudentNetwork(models.student, use_bf16(device, models.precision), eos_id=eos)
        self.metrics = Metrics(lambda: (self.batcher.queued_calls, self.batcher.active_jobs))
        self.batcher = BatchedNetwork(student_net, settings.max_batch, self.metrics.on_call,
                                      own_thread=settings.batcher_thread, on_retry=self.metrics.retried.inc)
        self._admitted = 0
        self._load = 0
        self._lock = threading.Lock()
        self._encode_lock = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once

    def admit(self, cost: int) -> bool:
        """Take a request of ``cost`` row-calls if it fits (module docstring)."""
        with self._lock:
            if self._admitted >= self.settings.max_queue or self._load + cost > self.settings.max_load:
                return False
            self._admitted += 1
            self._load += cost
            self.metrics.in_flight.inc()
            self.metrics.load.inc(cost)
            return True

    def release(self, cost: int) -> None:
        with self._lock:
            self._admitted -= 1
            self._load -= cost
            self.metrics.in_flight.dec()
            self.metrics.load.dec(cost)

    def settings_for(self, req: Request, prompts: int) -> tuple[SampleConfig, int]:
        """The request's sampler settings and its cost in row-calls, or :class:`BadRequest`."""
        try:
            sample = self.model.settings_with(**req.sample_changes())
        except ConfigError as err:
            key = re.match(r"config error: sample\.(\w+):", str(err))  # the field SampleConfig names
            raise BadRequest(str(err).removeprefix("config error: "), key and key.group(1)) from None
        if self.model.models.student.cfg.cfg_tokens == 0 and sample.sc_cfg != 1.0:
            raise BadRequest(f"sc_cfg: this model has no SC-CFG tokens, so sc_cfg must be 1, not {sample.sc_cfg}",
                             "sc_cfg")
        return sample, check_cost(self.settings, sample, prompts, req.n, req.readouts, req.stream)

    def prompt_tokens(self, prompts: list[str], param: str) -> int:
        """The tokens of ``prompts`` on their canvases, or OpenAI's ``context_length_exceeded``
        when one does not fit the canvas's prompt region."""
        canvas = self.model.models.frozen.canvas
        with self._encode_lock:
            lengths = [len(ids) for ids in token_ids(canvas.tokenizer, prompts)]
        too_long = [k for k, n in enumerate(lengths) if n > canvas.prompt_cap]
        if too_long:
            k = too_long[0]
            which = f"prompt {k} has" if len(prompts) > 1 else "your prompt has"
            raise BadRequest(f"This model's maximum context length is {canvas.canvas_len} tokens, of which a prompt "
                             f"may take {canvas.prompt_cap}; {which} {lengths[k]} tokens. Please reduce the length "
                             "of the prompt.", param, code="context_length_exceeded")
        return sum(lengths)

    def start(self, prompts: list[str], sample: SampleConfig, req: Request, cancel: threading.Event) -> Future:
        """Submit one request to the batched network; its future holds :meth:`run`'s results."""
        return self.batcher.submit(lambda _net: self.run(prompts, sample, req, cancel), cancel)

    def run(self, prompts: list[str], sample: SampleConfig, req: Request,
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

    def choices(self, results: list[GenerationResult], req: Request) -> list[Choice]:
        tok = self.model.models.frozen.tokenizer

        def decode(tokens: list[int]) -> str:
            return tok.decode(tokens, skip_special_tokens=True)

        def encode(text: str) -> list[int]:
            with self._encode_lock:
                return tok.encode(text, add_special_tokens=False)

        stops = req.stops()
        out = []
        for k, r in enumerate(results):
            text, count, finish = cut_answer(r.text, r.tokens, r.ended, req.answer_limit, stops, decode, encode)
            out.append(Choice(index=k, text=text, finish_reason=finish, completion_tokens=count, nfe=r.nfe,
                              seed=r.seed))
        return out

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
