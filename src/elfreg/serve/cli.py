"""``elfreg serve``: an OpenAI-compatible HTTP server for one checkpoint (docs/serving.md).

    elfreg serve --checkpoint runs/demo/elf-reg [--host 127.0.0.1] [--port 8000] [--max-batch 32]
        [--max-queue 64] [--max-load 65536] [--max-nfe 256] [--max-rows 64] [--request-timeout 300]
        [--max-body-bytes 1048576] [--device auto] [--precision auto]

Each network call takes up to ``--max-batch`` rows from every request in flight, wherever each
is on its time grid. A request over a per-request limit (``--max-nfe``, ``--max-grid-points``,
``--max-rows``, ``--max-readout-steps``, the canvas's prompt length) is refused with a 400 naming
it; one that does not fit the admission limits (``--max-queue`` requests, ``--max-load``
row-calls in flight) gets 429; one not answered within ``--request-timeout`` seconds gets 408.
SIGTERM or Ctrl-C stops taking requests and finishes those in flight within
``--graceful-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..device import add_device_flags
from .limits import ServeSettings

DEFAULTS = ServeSettings()
LIMITS = {  # ServeSettings field: (type, help); the default is the field's
    "max_batch": (int, "rows per network call"),
    "max_queue": (int, "requests admitted at once, running or waiting (one more is answered 429)"),
    "max_load": (int, "row-calls admitted at once: each request counts its rows (prompts × n, twice with prompt "
                      "CFG) times its NFE; one that does not fit is answered 429, so small requests pass large ones"),
    "max_nfe": (int, "the largest NFE budget a request may ask for (more: 400)"),
    "max_grid_points": (int, "the largest master grid, nfe × rho points (more: 400)"),
    "max_rows": (int, "rows of one request: prompts × n, doubled by prompt CFG (more: 400)"),
    "max_readout_steps": (int, "steps one streamed request may record for its readouts, over all its answers "
                               "(more: 400)"),
    "max_body_bytes": (int, "request body size; a larger one is answered 413 before it is read"),
    "request_timeout": (float, "seconds an admitted request may take; then it is answered 408 and stops"),
    "keepalive": (float, "seconds between the keep-alive comments of a stream that is still sampling"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible server for a checkpoint (continuous batching)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="run, checkpoint or release folder, or an owner/name Hub id of a release (elfreg export)")
    p.add_argument("--revision", help="Hub revision (branch, tag or commit) of a Hub id")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port, printed)")
    for name, (kind, text) in LIMITS.items():
        default = getattr(DEFAULTS, name)
        shown = f"{default:g}" if kind is float else default
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default, help=f"{text} (default {shown})")
    p.add_argument("--model-name", help="the model id clients name (default: the checkpoint folder's name)")
    p.add_argument("--graceful-timeout", type=float, default=60.0,
                   help="seconds the requests in flight get to finish after SIGTERM (default 60)")
    p.add_argument("--raw-weights", action="store_true", help="serve the raw weights instead of the EMA")
    add_device_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import create_app
    from .model import load
    from .server import Server
    from .threads import serve_here

    if not 0 <= args.port < 65536 or args.graceful_timeout < 0:
        raise ValueError("--port must be in 0..65535 and --graceful-timeout >= 0")
    name = args.model_name or Path(str(args.checkpoint)).name
    settings = ServeSettings(model_name=name, batcher_thread=False,
                             **{k: getattr(args, k) for k in LIMITS}).validate()  # before the model loads
    # on stderr: stdout's one line is where the server listens, which scripts read
    print(f"loading {args.checkpoint} (a first use may build or fetch what it needs; each step says so)",
          file=sys.stderr, flush=True)
    began = time.monotonic()
    model = load(args.checkpoint, args.revision, args.device, args.precision, use_ema=not args.raw_weights)
    print(f"loaded {model.models.checkpoint} in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    server = Server(model, settings)
    config = uvicorn.Config(create_app(server), host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=args.graceful_timeout)
    web = uvicorn.Server(config)
    announce = web.startup

    async def startup(sockets=None) -> None:  # say where, once the socket is bound (--port 0 picks one)
        await announce(sockets)
        port = web.servers[0].sockets[0].getsockname()[1] if web.servers else args.port
        print(f"serving {name} at http://{args.host}:{port}/v1 (max batch {args.max_batch}, "
              f"max queue {args.max_queue}, max load {args.max_load} row-calls)", flush=True)

    web.startup = startup
    serve_here(server, web)  # HTTP in a side thread, the network calls on this one (elfreg.serve.threads)
    return 0
