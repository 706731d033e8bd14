"""A served checkpoint on a loopback port, in a thread, for the serving tests; plain HTTP for
what no client library would send."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import uvicorn

import elfreg
from elfreg.serve.app import create_app
from elfreg.serve.limits import ServeSettings
from elfreg.serve.server import Server


class Reply:
    def __init__(self, status: int, text: str, headers: dict[str, str] | None = None):
        self.status_code, self.text, self.headers = status, text, headers or {}

    def json(self):
        return json.loads(self.text)


def call(url: str, method: str = "GET", path: str = "/", body: bytes | None = None, timeout: float = 60) -> Reply:
    """One plain HTTP request."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"} if body is not None else {})
        r = conn.getresponse()
        return Reply(r.status, r.read().decode(), dict(r.getheaders()))
    finally:
        conn.close()


def post(url: str, path: str, payload: object, timeout: float = 60) -> Reply:
    return call(url, "POST", path, json.dumps(payload).encode(), timeout)


def raw(url: str) -> socket.socket:
    """A socket connected to the server, for requests sent a piece at a time."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=60)


def read_reply(sock: socket.socket) -> Reply:
    """The HTTP answer on ``sock`` (status line, headers, a body of Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    want = int(headers.get("content-length", len(body)))
    while len(body) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Reply(int(lines[0].split()[1]), body.decode(), headers)


class Running:
    """A server on a free loopback port, in a thread; ``settings`` are ServeSettings' fields."""

    def __init__(self, checkpoint, **settings):
        import openai

        self.model = elfreg.load(checkpoint, device="cpu")
        self.server = Server(self.model, ServeSettings(model_name="tiny", **settings))
        self.web = uvicorn.Server(uvicorn.Config(create_app(self.server), host="127.0.0.1", port=0,
                                                 log_level="warning"))
        started = threading.Event()
        startup = self.web.startup

        async def announce(sockets=None) -> None:
            await startup(sockets)
            started.set()

        self.web.startup = announce
        self.thread = threading.Thread(target=self.web.run, daemon=True)
        self.thread.start()
        if not started.wait(60) or not self.web.started:
            raise RuntimeError("the server did not start")
        port = self.web.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def metrics(self) -> str:
        return call(self.url, path="/metrics").text

    def stop(self) -> None:
        self.web.should_exit = True
        self.thread.join(30)
        self.server.close()


def wait_for(condition, what: str, timeout: float = 60) -> None:
    """Wait until ``condition()`` holds (a state the server reaches); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def held(r: Running) -> tuple[threading.Event, threading.Event]:
    """Make ``r``'s requests wait, once their sampling starts, until ``release`` is set (the
    scheduler's thread waits, so every later request waits too); ``entered`` is set when one
    has started. Returns (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    original = r.server.run

    def held_run(*args):
        entered.set()
        release.wait(60)
        return original(*args)

    r.server.run = held_run
    return entered, release


def gauge(r: Running, name: str) -> float:
    """The value of one of ``r``'s gauges (``in_flight``, ``load``)."""
    return getattr(r.server.metrics, name)._value.get()


def send(url: str, payload: dict, path: str = "/v1/completions") -> http.client.HTTPConnection:
    """Send a request and leave its answer unread (``answer`` reads it), so that it can be in
    flight while the test does something else."""
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    conn.request("POST", path, json.dumps(payload), {"content-type": "application/json"})
    return conn


def answer(conn: http.client.HTTPConnection) -> dict:
    """The JSON answer of a request ``send`` sent."""
    try:
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()
