"""The requests ``elfreg serve`` accepts and the answers it gives: OpenAI's completion and chat
formats, with the sampler's settings beside OpenAI's fields.

A request may set every field of :class:`~elfreg.config.SampleConfig` (``nfe``, ``sampler``,
``sc_cfg``, ``trim``, ...; read from the dataclass, so the two never drift apart) beside
OpenAI's ``n``, ``max_tokens``, ``stop``, ``stream`` and ``seed``, and elfreg's ``readouts``
(stream the decoded answer of every k-th denoiser step). A setting a request leaves out is the
checkpoint's. Any other field is refused (400, naming it): a flow model has no temperature or
top-p to honour, and silently ignoring one would return another model's behaviour.

``seed`` defaults to 0, so the same request gives the same text; choice j of a prompt uses seed
``seed + j`` (as ``elfreg sample --samples n``). ``max_tokens`` cuts the answer to that many
tokens (the canvas bounds it anyway); ``finish_reason`` is ``length`` when the answer was cut
or filled the canvas without an end token, else ``stop``.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..config import SampleConfig
from ..config import settings as _settings

_SAMPLE_FIELDS = {f.name for f in dataclasses.fields(SampleConfig)}


def _sample_field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(SampleConfig, vars(_settings))
    return {f.name: (hints[f.name] | None, Field(default=None, description=f.metadata.get("help")))
            for f in dataclasses.fields(SampleConfig)}


def _text(value: str, field: str) -> str:
    """``value`` if it is text a tokenizer can read (JSON can carry lone UTF-16 surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{field}: not valid Unicode text (a lone surrogate)", field) from None
    return value


class BadRequest(ValueError):
    """A request the server refuses (400): one line, and the field at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_SamplerFields = create_model("SamplerFields", __base__=_Strict, **_sample_field_types())


class _Common(_SamplerFields):
    model: str | None = None
    n: int = Field(default=1, ge=1, le=64)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    readouts: int = Field(default=0, ge=0, description="stream the decoded answer of every k-th step")
    user: str | None = None  # OpenAI's end-user id: accepted, recorded nowhere

    def sample_changes(self) -> dict[str, Any]:
        """The sampler settings this request sets."""
        return {k: v for k, v in self.model_dump().items() if k in _SAMPLE_FIELDS and v is not None}

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops) or len(stops) > 4:
            raise BadRequest("stop: at most 4 non-empty strings", "stop")
        return stops


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: str | list[str]

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        if not prompts:
            raise BadRequest("prompt: give at least one prompt", "prompt")
        return [_text(p, "prompt") for p in prompts]


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str


class ChatRequest(_Common):
    """``POST /v1/chat/completions``: one user message, rendered with the checkpoint's prompt
    template (the model was trained on single prompts, not conversations)."""

    messages: list[ChatMessage]

    def question(self) -> str:
        if len(self.messages) != 1 or self.messages[0].role != "user":
            roles = ", ".join(m.role for m in self.messages) or "none"
            raise BadRequest(f"messages: give exactly one user message (this model answers single prompts; "
                             f"got {roles})", "messages")
        return _text(self.messages[0].content, "messages")


@dataclasses.dataclass
class Choice:
    """One answer of a request, ready for either format."""

    index: int
    text: str
    finish_reason: str
    completion_tokens: int
    nfe: int
    seed: int


def cut_answer(text: str, tokens: list[int], eos_reached: bool, max_tokens: int | None, stops: list[str],
               decode: typing.Callable[[list[int]], str], encode: typing.Callable[[str], list[int]]
               ) -> tuple[str, int, str]:
    """(text, completion tokens, finish_reason) of one answer after ``max_tokens`` and ``stop``."""
    finish = "stop" if eos_reached else "length"
    if max_tokens is not None and len(tokens) > max_tokens:
        tokens, finish = tokens[:max_tokens], "length"
        text = decode(tokens)
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    if cut < 0:
        return text, len(tokens), finish
    return text[:cut], len(encode(text[:cut])), "stop"


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object: what the ``openai`` client raises from."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
