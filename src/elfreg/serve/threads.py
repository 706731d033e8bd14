"""Where ``elfreg serve``'s work runs: the HTTP server (uvicorn) in a side thread; the requests
(greenlet jobs of :class:`~elfreg.serve.batcher.BatchedNetwork`) and the merged network calls on
the main thread, the thread that loaded the model.

Why the main thread: torch's OpenMP team belongs to the thread that starts a parallel region, and
the main thread's team exists once the model is loaded. A scheduler on another thread gets a
second team; with more OpenMP threads than cores GNU OpenMP's workers stop spinning between
regions, and every merged call pays for waking them (measured in docs/serving.md).

SIGTERM and SIGINT are taken on the main thread and handed to uvicorn as its own handlers would
take them: stop taking requests, finish those in flight within uvicorn's graceful timeout (a
second SIGINT forces the exit). Once everything has stopped the signal is raised again, so the
process ends the way the signal asks.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import uvicorn

from .server import Server

HANDLED = (signal.SIGINT, signal.SIGTERM)


def serve_here(server: Server, web: uvicorn.Server, signals: bool = True) -> None:
    """Serve ``web`` from a side thread and make ``server``'s network calls on this thread until
    ``web`` stops (``web.should_exit``, or a signal), then close ``server``. ``server`` must have
    been made with ``ServeSettings(batcher_thread=False)``. ``signals`` (main thread only): take
    SIGTERM and SIGINT as the module docstring says."""
    if server.batcher.owns_thread:
        raise ValueError("serve_here needs a server whose batcher runs on the caller's thread "
                         "(ServeSettings(batcher_thread=False))")
    caught: list[int] = []

    def on_signal(sig: int, frame: FrameType | None) -> None:
        caught.append(sig)
        web.handle_exit(sig, frame)

    previous = {sig: signal.signal(sig, on_signal) for sig in HANDLED} if signals else {}

    def serve_web() -> None:
        try:
            web.run()
        finally:
            server.batcher.close()  # so that run() below returns

    web_thread = threading.Thread(target=serve_web, name="elfreg-http")
    web_thread.start()
    try:
        server.batcher.run()
    finally:
        web.should_exit = True
        web_thread.join()
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for sig in reversed(caught):
        signal.raise_signal(sig)  # end as the signal asks, now that everything is drained
