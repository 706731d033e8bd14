"""``elfreg serve``: an OpenAI-compatible HTTP server for one checkpoint (docs/serving.md).

    elfreg serve --checkpoint runs/demo/elf-reg [--host 127.0.0.1] [--port 8000] [--max-batch 32]
        [--max-queue 64] [--device auto] [--precision auto]

Each network call takes up to ``--max-batch`` rows from every request in flight, wherever each
is on its time grid; at most ``--max-queue`` requests are admitted at once (one more gets 429).
SIGTERM or Ctrl-C stops taking requests and finishes those in flight within
``--graceful-timeout`` seconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..device import add_device_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible server for a checkpoint (continuous batching)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run, checkpoint or release folder, or an owner/name Hub id")
    p.add_argument("--revision", help="Hub revision (branch, tag or commit) of a Hub id")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port, printed)")
    p.add_argument("--max-batch", type=int, default=32, help="rows per network call (default 32)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests admitted at once, running or waiting (default 64; one more is answered 429)")
    p.add_argument("--model-name", help="the model id clients name (default: the checkpoint folder's name)")
    p.add_argument("--graceful-timeout", type=float, default=60.0,
                   help="seconds the requests in flight get to finish after SIGTERM (default 60)")
    p.add_argument("--raw-weights", action="store_true", help="serve the raw weights instead of the EMA")
    add_device_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import Server, ServeSettings, create_app
    from .model import load
    from .threads import serve_here

    if args.max_batch < 1 or args.max_queue < 1 or not 0 <= args.port < 65536 or args.graceful_timeout < 0:
        raise ValueError("--max-batch and --max-queue must be >= 1, --port in 0..65535, --graceful-timeout >= 0")
    model = load(args.checkpoint, args.revision, args.device, args.precision, use_ema=not args.raw_weights)
    name = args.model_name or Path(str(args.checkpoint)).name
    server = Server(model, ServeSettings(max_batch=args.max_batch, max_queue=args.max_queue, model_name=name,
                                         batcher_thread=False))
    config = uvicorn.Config(create_app(server), host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=args.graceful_timeout)
    web = uvicorn.Server(config)
    announce = web.startup

    async def startup(sockets=None) -> None:  # say where, once the socket is bound (--port 0 picks one)
        await announce(sockets)
        port = web.servers[0].sockets[0].getsockname()[1] if web.servers else args.port
        print(f"serving {name} at http://{args.host}:{port}/v1 (max batch {args.max_batch}, "
              f"max queue {args.max_queue})", flush=True)

    web.startup = startup
    serve_here(server, web)  # HTTP in a side thread, the network calls on this one (elfreg.serve.threads)
    return 0
