"""The requests ``elfreg serve`` accepts and the answers it gives: OpenAI's completion and chat
formats, with the sampler's settings beside OpenAI's fields.

A request may set every field of :class:`~elfreg.config.SampleConfig` (``nfe``, ``sampler``,
``sc_cfg``, ``trim``, ...; read from the dataclass, so the two never drift apart) beside
OpenAI's ``n``, ``max_tokens`` (or ``max_completion_tokens``), ``stop``, ``stream``,
``stream_options`` and ``seed``, and elfreg's ``readouts`` (stream the decoded answer of every
k-th denoiser step). A setting a request leaves out is the checkpoint's.

OpenAI fields a flow model cannot honour (``temperature``, ``top_p``, ``logprobs``, penalties,
...) are accepted at their neutral value (:data:`NEUTRAL`: null, or what asks for no change:
``temperature`` 1, penalties 0), as client libraries send them; any other value is refused (400,
naming the field): silently ignoring it would return another behaviour than the client asked
for. Any other field is refused too.

Parsing (:func:`parse_request`) is where every input is bounded: the body is JSON (pydantic's
parser: invalid UTF-8, lone surrogates, nesting deeper than a few hundred levels and numbers of
thousands of digits are refused), integers fit 32 bits, floats are finite and within ±1e6 (the
network computes in float32 or bfloat16), so no value reaches torch arithmetic that overflows it.

``seed`` defaults to 0, so the same request gives the same text; choice j of a prompt uses seed
``seed + j`` (as ``elfreg sample --samples n``). ``max_tokens`` cuts the answer to that many
tokens (the canvas bounds it anyway); ``finish_reason`` is ``length`` when the answer was cut
or filled the canvas without an end token, else ``stop``.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from ..config import SampleConfig
from ..config import settings as _settings

_SAMPLE_FIELDS = {f.name for f in dataclasses.fields(SampleConfig)}
INT_LIMIT = 2**31 - 1  # every integer of a request (a seed excepted) lies within ±INT_LIMIT
FLOAT_LIMIT = 1e6  # every float of a request lies within ±FLOAT_LIMIT
Int = Annotated[int, Field(ge=-INT_LIMIT, le=INT_LIMIT)]
Float = Annotated[float, Field(ge=-FLOAT_LIMIT, le=FLOAT_LIMIT, allow_inf_nan=False)]


def _bounded(hint: Any) -> Any:
    """``hint`` with its ints and floats bounded as the module docstring says."""
    return Int if hint is int else Float if hint is float else hint


def _sample_field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(SampleConfig, vars(_settings))
    return {f.name: (_bounded(hints[f.name]) | None, Field(default=None, description=f.metadata.get("help")))
            for f in dataclasses.fields(SampleConfig)}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# OpenAI's fields with no meaning for a flow model, and the values that ask for nothing (null
# always passes): {field: (what is accepted, in words; the test)}
NEUTRAL: dict[str, tuple[str, typing.Callable[[Any], bool]]] = {
    "temperature": ("1", lambda v: _number(v) and v == 1),
    "top_p": ("1", lambda v: _number(v) and v == 1),
    "presence_penalty": ("0", lambda v: _number(v) and v == 0),
    "frequency_penalty": ("0", lambda v: _number(v) and v == 0),
    "logprobs": ("false", lambda v: v is False),
    "top_logprobs": ("0", lambda v: _number(v) and v == 0),
    "logit_bias": ("{}", lambda v: v == {}),
    "echo": ("false", lambda v: v is False),
    "best_of": ("1", lambda v: _number(v) and v == 1),
    "suffix": ("\"\"", lambda v: v == ""),
    "response_format": ('{"type": "text"}', lambda v: v == {"type": "text"}),
    "tools": ("[]", lambda v: v == []),
    "tool_choice": ('"none"', lambda v: v == "none"),
    "parallel_tool_calls": ("true or false (no tools are called)", lambda v: isinstance(v, bool)),
    "store": ("false", lambda v: v is False),
    "metadata": ("an object of strings (recorded nowhere)",
                 lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values())),
    "service_tier": ('"auto" or "default"', lambda v: v in ("auto", "default")),
    "modalities": ('["text"]', lambda v: v == ["text"]),
}


class BadRequest(ValueError):
    """A request the server refuses (400): one line, and the field at fault. ``code`` is OpenAI's
    error code where it has one (``context_length_exceeded``)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


_SamplerFields = create_model("SamplerFields", __base__=_Strict, **_sample_field_types())
_Neutral = create_model("NeutralFields", __base__=_SamplerFields, **{k: (Any, None) for k in NEUTRAL})


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Neutral):
    model: str | None = None
    n: int = Field(default=1, ge=1, le=INT_LIMIT)
    max_tokens: int | None = Field(default=None, ge=1, le=INT_LIMIT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT_LIMIT)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    readouts: int = Field(default=0, ge=0, le=INT_LIMIT, description="stream the decoded answer of every k-th step")
    user: str | None = None  # OpenAI's end-user id: accepted, recorded nowhere

    def sample_changes(self) -> dict[str, Any]:
        """The sampler settings this request sets."""
        return {k: v for k in _SAMPLE_FIELDS if (v := getattr(self, k)) is not None}

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops) or len(stops) > 4:
            raise BadRequest("stop: at most 4 non-empty strings", "stop")
        return stops

    @property
    def answer_limit(self) -> int | None:
        """``max_tokens``, or ``max_completion_tokens`` (the same thing by its newer name)."""
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check(self) -> None:
        """What a field's type cannot say: neutral values, fields that must agree."""
        for name, (allowed, ok) in NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and not ok(value):
                raise BadRequest(f"{name}: a flow model has no {name.replace('_', ' ')} to honour; only null or "
                                 f"{allowed} (its neutral value) is accepted, got {_short(value)}", name)
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise BadRequest("max_completion_tokens: differs from max_tokens (give one of them)",
                             "max_completion_tokens")
        if self.stream_options is not None and not self.stream:
            raise BadRequest("stream_options: only allowed when stream is true", "stream_options")
        self.stops()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: str | list[str]

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        if not prompts:
            raise BadRequest("prompt: give at least one prompt", "prompt")
        return prompts


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart]
    name: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_Common):
    """``POST /v1/chat/completions``: one user message, after any system (or developer)
    messages; the model was trained on single prompts, not conversations."""

    messages: list[ChatMessage]

    def question(self) -> str:
        """The user's message with the system messages before it, a blank line apart (the
        system prompt is prepended to the user turn)."""
        roles = [m.role for m in self.messages]
        if roles.count("user") != 1 or roles[-1] != "user" or any(r in ("assistant", "tool") for r in roles):
            raise BadRequest(f"messages: give one user message, after any system messages (this model answers "
                             f"single prompts; got {', '.join(roles) or 'none'})", "messages")
        return "\n\n".join(m.text for m in self.messages)


def parse_request(kind: type[_Common], body: bytes) -> Any:
    """``body`` as a request of ``kind``, checked (module docstring), or :class:`BadRequest`
    in one line naming the first field at fault."""
    try:
        req = kind.model_validate_json(body)
    except ValidationError as err:
        raise _bad_field(err) from None
    req.check()
    return req


_UNION_MEMBER = re.compile(r"str|int|float|bool|[a-z]+\[.*\]|[A-Z]\w*")


def _bad_field(err: ValidationError) -> BadRequest:
    first = err.errors(include_url=False)[0]
    # the path to the field, without the names pydantic gives the members of a union ("str", "list[str]")
    where = [str(p) for p in first.get("loc", ()) if not _UNION_MEMBER.fullmatch(str(p))]
    field = where[0] if where else None
    name = ".".join(where) or "body"
    if first.get("type") == "extra_forbidden":
        return BadRequest(f"{name}: unknown field (not an OpenAI field this server honours, nor a sampler setting)",
                          field)
    message = " ".join(str(first.get("msg", "invalid")).split())  # one line, whatever the parser said
    return BadRequest(f"{name}: {message}", field)


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


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error",
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: what the ``openai`` client raises from."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}

