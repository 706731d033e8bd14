"""The HTTP side's guard around ``elfreg serve``'s routes: the request body limit, and every
error, whoever raises it, as OpenAI's error object, counted in the metrics.

Contract:

- a body longer than ``max_body_bytes`` is answered 413 before it is read whole: at once from
  its ``Content-Length``, and for a chunked body as soon as the bytes read pass the limit (the
  rest is never read, so a slow or huge upload holds no memory and no worker);
- every answer is counted once in ``elfreg_requests_total`` by route and status
  (:meth:`~elfreg.serve.metrics.Metrics.answered`); a route that ends a stream in an error
  after its 200 was sent names that status in ``request.state.status``;
- every 4xx and 5xx that FastAPI or Starlette make themselves (an unknown route, a wrong method,
  an exception no route caught) carries OpenAI's ``{"error": {...}}``, never ``{"detail": ...}``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import Metrics
from .protocol import BadRequest, error_body

GONE = 499  # nginx's status for a client that closed the connection before the answer


class BodyTooLarge(Exception):
    """The request body passed the server's limit while it was read."""


def error_response(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                   code: str | None = None) -> JSONResponse:
    """OpenAI's error object as an HTTP answer."""
    return JSONResponse(error_body(message, param, kind, code), status_code=status)


def too_large(limit: int) -> JSONResponse:
    return error_response(413, f"the request body is larger than this server's limit of {limit} bytes "
                          "(elfreg serve --max-body-bytes)", kind="invalid_request_error")


class Guard:
    """ASGI middleware: the body limit and the count of every answer (module docstring)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: Metrics):
        self.app, self.limit, self.metrics = app, max_body_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None
        # request.state of the routes, made here so that the routes' copies of the scope share it
        state = scope.setdefault("state", {})

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        read = 0

        async def bounded() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.limit:
                    raise BodyTooLarge
            return message

        try:
            if _declared_length(scope) > self.limit:
                await too_large(self.limit)(scope, receive, sent)
            else:
                await self.app(scope, bounded, sent)
        finally:
            final = state.get("status") or status or 500  # none sent: the app raised
            self.metrics.answered(scope["path"], final)


def _declared_length(scope: Scope) -> int:
    """The body length the headers declare (0 when none does; the HTTP server has already
    refused a malformed one)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


def install(app: FastAPI, max_body_bytes: int, metrics: Metrics) -> None:
    """The guard and the error handlers on ``app`` (module docstring)."""
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, metrics=metrics)

    @app.exception_handler(BadRequest)
    async def bad_request(_request: Request, err: BadRequest) -> JSONResponse:
        return error_response(400, str(err), err.param, code=err.code)

    @app.exception_handler(BodyTooLarge)
    async def body_too_large(_request: Request, _err: BodyTooLarge) -> JSONResponse:
        return too_large(max_body_bytes)

    @app.exception_handler(ClientDisconnect)
    async def went_away(_request: Request, _err: ClientDisconnect) -> JSONResponse:
        return error_response(GONE, "the client went away", kind="cancelled")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {err.detail}"
        return error_response(err.status_code, message, kind="invalid_request_error" if err.status_code < 500
                              else "server_error")

    @app.exception_handler(Exception)
    async def server_error(_request: Request, err: Exception) -> JSONResponse:
        return error_response(500, f"the server failed: {type(err).__name__}", kind="server_error")
