"""Load on ``elfreg serve``: continuous batching against one request at a time and against static
batching, side by side in one run, through the ``openai`` client on loopback.

    python benchmarks/serve_load.py --checkpoint runs/demo/elf-reg --clients 1,4,16,64 --out out/serve_load.json
    python benchmarks/serve_load.py --checkpoint b-random --clients 1,4 --requests 2   # the B shape, random weights

Each of C clients sends ``--requests`` completions one after another, waiting an exponential
think time (mean ``--think``; Poisson arrivals per client, seeded) between an answer and its next
request; every request asks for ``--nfe`` NFE with its own seed. The server admits every client's
request (``--max-queue`` ≥ C); what differs is how requests share network calls:

- ``continuous``: elfreg's scheduler: each call takes rows from every request in flight, wherever
  it is on its grid; a new request joins at the next call;
- ``one-at-a-time``: requests run one after another (each on its own rows);
- ``static``: requests wait until a full batch of min(C, max batch) is gathered (or every client
  still sending is waiting) and no batch is running, then run together; none joins a running
  batch.

The clients run in a process of their own (one thread each, the same process for every run), as
a server's clients do; in the server's process their HTTP and JSON work would compete for its
interpreter lock. Reported per
(mode, C): requests/s, answer tokens/s, p50/p99 latency (admission to answer, as the client sees
it), rows per network call, milliseconds per network call, and the share of the run the network
was busy. Texts are checked equal across modes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import serve_clients
import torch
import uvicorn

import elfreg
from elfreg.runs import write_json_atomic
from elfreg.serve.app import create_app
from elfreg.serve.limits import ServeSettings
from elfreg.serve.server import Server
from elfreg.serve.threads import serve_here
from elfreg.text.canvas import token_ids
from elfreg.toy import arith
from elfreg.toy.registry import as_example

MODES = ("continuous", "one-at-a-time", "static")


class Gate:
    """Holds submitted requests back and lets them through in whole batches of ``size``, one batch
    at a time: static batching, or one request at a time at size 1. A batch is full at ``size``
    requests, or when every client still sending is waiting (the last requests of a run: no more
    can come). It never blocks: requests are released from the callbacks of finished ones."""

    def __init__(self, start: Callable[..., Future], size: int, clients: int):
        self._start, self.size, self.clients = start, size, clients
        self._lock = threading.Lock()
        self._held: list[tuple[tuple, Future]] = []
        self._running = 0

    def submit(self, *args: Any) -> Future:
        outer: Future = Future()
        with self._lock:
            self._held.append((args, outer))
        self._release()
        return outer

    def client_done(self) -> None:
        with self._lock:
            self.clients -= 1
        self._release()

    def _release(self) -> None:
        with self._lock:
            if self._running or not self._held or len(self._held) < min(self.size, max(self.clients, 1)):
                return
            batch, self._held = self._held[:self.size], self._held[self.size:]
            self._running = len(batch)
        for args, outer in batch:
            self._start(*args).add_done_callback(lambda inner, outer=outer: self._finished(inner, outer))

    def _finished(self, inner: Future, outer: Future) -> None:
        with self._lock:
            self._running -= 1
        self._release()
        if inner.exception() is not None:
            outer.set_exception(inner.exception())
        else:
            outer.set_result(inner.result())


def serve(model: Any, mode: str, clients: int, max_batch: int, nfe: int
          ) -> tuple[Server, uvicorn.Server, Gate | None]:
    """The server of one mode, its network calls to be made by ``serve_here`` on the main
    thread, as ``elfreg serve`` makes them; its limits admit every client's request."""
    queue_size, max_nfe = max(64, clients), max(nfe, ServeSettings.max_nfe)
    server = Server(model, ServeSettings(max_batch=max_batch, max_queue=queue_size, model_name="bench",
                                         max_nfe=max_nfe, max_load=queue_size * ServeSettings.max_rows * max_nfe,
                                         batcher_thread=False))
    gate = None
    if mode != "continuous":
        gate = Gate(server.start, 1 if mode == "one-at-a-time" else min(clients, max_batch), clients)
        server.start = gate.submit
    web = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=0, log_level="warning"))
    return server, web, gate


def load_run(model: Any, mode: str, clients: int, prompts: list[str], args: argparse.Namespace,
             senders: Clients, run_id: int) -> dict[str, Any]:
    server, web, gate = serve(model, mode, clients, args.max_batch, args.nfe)
    measured: dict[str, Any] = {}

    def drive() -> None:  # the clients' run, beside the main thread's network calls
        try:
            while not web.started:
                time.sleep(0.01)
            url = f"http://127.0.0.1:{web.servers[0].sockets[0].getsockname()[1]}/v1"
            measured["clients"] = senders.run(run_id, url, clients, prompts, args, gate)
        finally:
            web.should_exit = True

    driver = threading.Thread(target=drive)
    driver.start()
    serve_here(server, web, signals=False)
    driver.join()
    if "clients" not in measured:
        raise RuntimeError(f"the clients' run of {mode} at {clients} clients failed (see above)")
    latencies, tokens, texts, wall = measured["clients"]
    calls, rows, busy = server.batcher.stats.calls, server.batcher.stats.rows, server.batcher.stats.seconds
    lat = sorted(latencies)
    return {"mode": mode, "clients": clients, "requests": len(lat), "seconds": wall,
            "requests_per_s": len(lat) / wall, "answer_tokens_per_s": tokens / wall,
            "p50_s": statistics.median(lat), "p99_s": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))],
            "rows_per_call": rows / calls if calls else 0.0, "network_calls": calls,
            "network_ms_per_call": 1e3 * busy / calls if calls else 0.0, "network_busy": busy / wall, "texts": texts}


class Clients:
    """The process the clients run in (``serve_clients``), one for every run: in the server's
    process their HTTP and JSON work would take its interpreter lock from the requests it serves."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.finished = context.Queue()
        self.pool = ProcessPoolExecutor(1, mp_context=context, initializer=serve_clients.hand_over,
                                        initargs=(self.finished,))

    def run(self, run_id: int, url: str, clients: int, prompts: list[str], args: argparse.Namespace,
            gate: Gate | None) -> tuple[list[float], int, dict[int, str], float]:
        """The clients' latencies, answer tokens, texts (by request id) and wall seconds from
        the first request's start to the last answer. A client that has sent its last request
        is reported back at once (the static gate stops waiting for it)."""
        settings = {k: getattr(args, k) for k in ("requests", "think", "nfe", "sampler", "seed")}
        future = self.pool.submit(serve_clients.send, url, clients, prompts, settings, run_id)
        reported = 0
        while reported < clients:
            try:
                done_run, _ = self.finished.get(timeout=0.5)
            except queue.Empty:
                if future.done():
                    return future.result()  # done before its last reports came, or failed: raises
                continue
            if done_run != run_id:  # an earlier run's report, come after its run ended
                continue
            reported += 1
            if gate is not None:
                gate.client_done()
        return future.result()

    def close(self) -> None:
        self.pool.shutdown()


def b_random_checkpoint(folder: Path) -> Path:
    """A checkpoint of ELF-REG-B's student shape (width 768, 12 blocks, 12 heads, canvas 256 with a
    64-token prompt cap, REG width 2048) with random weights, behind a random one-block encoder of
    Qwen3-0.6B's width (1024) over the toy tokenizer (its 832-entry vocabulary is also the
    decoder's): what B-shape network calls cost, with no download."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from elfreg.checkpoint import save_checkpoint
    from elfreg.config import Config
    from elfreg.model.presets import student_from_config
    from elfreg.model.student import STUDENT_FORMAT
    from elfreg.plugins import resolve_model_id
    from elfreg.text.tokenizer import load_tokenizer

    tokenizer = Path(resolve_model_id("toy:encoder")).parent / "tokenizer"
    vocab = len(load_tokenizer(str(tokenizer)))
    torch.manual_seed(0)
    encoder = folder / "encoder"
    Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=1024, intermediate_size=3072, num_hidden_layers=1,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                                 max_position_embeddings=512)).save_pretrained(encoder)
    cfg = Config.from_dict({
        "text": {"encoder": str(encoder), "encoder_layer": 1, "teacher": str(encoder), "tokenizer": str(tokenizer),
                 "canvas_len": 256, "prompt_cap": 64},
        "model": {"size": "elf-b", "projector_hidden": 2048},
        "sample": {"sc_cfg": 1.0}})
    student = student_from_config(cfg, 1024, vocab, 2048)
    for head in (student.final_layer.linear, student.reg_head.linear):  # zero at init: give them weights
        torch.nn.init.normal_(head.weight, std=0.02)
    run = folder / "run"
    save_checkpoint(run, 0, cfg, student, student.state_dict(), {}, {
        "student_format": STUDENT_FORMAT, "enc_dim": 1024, "vocab_size": vocab, "teacher_dim": 2048})
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="runs/demo/elf-reg",
                   help="a trained checkpoint (default: the demo's), or b-random (ELF-REG-B's shape, random weights)")
    p.add_argument("--clients", default="1,4,16,64", help="concurrent clients, comma-separated")
    p.add_argument("--requests", type=int, default=8, help="requests per client")
    p.add_argument("--think", type=float, default=0.05, help="mean think time between requests (s)")
    p.add_argument("--nfe", type=int, default=16)
    p.add_argument("--sampler", default="early-stop")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the server runs the model (cpu, cuda, auto)")
    p.add_argument("--out", help="write the results (with the command line) as JSON here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = b_random_checkpoint(Path(tmp)) if args.checkpoint == "b-random" else args.checkpoint
        model = elfreg.load(checkpoint, device=args.device)
    return _measure(model, args)


def fitted(model: Any, prompts: list[str]) -> list[str]:
    """``prompts``, each cut to its last tokens that fit the checkpoint's prompt region (the
    server refuses a longer one); says how many were cut (none for the demo's checkpoint)."""
    canvas = model.models.frozen.canvas
    ids = token_ids(canvas.tokenizer, prompts)
    out = [p if len(t) <= canvas.prompt_cap else canvas.tokenizer.decode(t[-canvas.prompt_cap:])
           for p, t in zip(prompts, ids, strict=True)]
    fits = [p for p, t in zip(out, token_ids(canvas.tokenizer, out), strict=True) if len(t) <= canvas.prompt_cap]
    cut = sum(len(t) > canvas.prompt_cap for t in ids)
    if cut:
        print(f"{cut} of {len(prompts)} prompts cut to the checkpoint's {canvas.prompt_cap}-token prompt region",
              flush=True)
    if not fits:
        raise SystemExit("no prompt fits the checkpoint's prompt region")
    return fits


def _measure(model: Any, args: argparse.Namespace) -> int:
    problems = arith.heldout("test", 1, arith.ArithConfig())
    prompts = fitted(model, [as_example(r).prompt for r in problems])
    rows = []
    senders = Clients()
    try:
        for clients in (int(c) for c in args.clients.split(",")):
            for mode in args.modes.split(","):
                r = load_run(model, mode, clients, prompts, args, senders, len(rows))
                rows.append(r)
                print(f"{mode:14s} C={clients:3d}  {r['requests_per_s']:7.2f} req/s  "
                      f"{r['answer_tokens_per_s']:8.1f} tok/s  p50 {r['p50_s']:6.3f} s  p99 {r['p99_s']:6.3f} s  "
                      f"rows/call {r['rows_per_call']:5.1f}  {r['network_ms_per_call']:5.1f} ms/call  "
                      f"network busy {100 * r['network_busy']:3.0f} %", flush=True)
            same = [r for r in rows if r["clients"] == clients]
            if any(r["texts"] != same[0]["texts"] for r in same):
                print(f"texts differ between modes at C={clients}", file=sys.stderr)
                return 1
    finally:
        senders.close()
    result = {"command": sys.argv, "settings": {k: v for k, v in vars(args).items()},
              "rows": [{k: v for k, v in r.items() if k != "texts"} for r in rows]}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
