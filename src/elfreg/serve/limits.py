"""What one request may cost ``elfreg serve``, and how the server is set up: :class:`ServeSettings`
(every field is a flag of ``elfreg serve``; docs/serving.md lists them with their defaults).

A request's cost is counted in *row-calls*: the rows it puts through the network (prompts × n,
twice that with prompt CFG, whose prompt-dropped rows share each call) times the network calls
of its NFE budget. Admission adds up the row-calls of the requests in flight, so that many small
requests pass where one large one would not fit (``max_load``), and a request that no server of
these settings would take is refused at once (400, naming the field and the limit) instead of
being admitted and run for hours.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..config import SampleConfig
from .protocol import BadRequest


@dataclass
class ServeSettings:
    """How the server batches, admits and bounds work (``elfreg serve --help``)."""

    max_batch: int = 32  # rows per network call
    max_queue: int = 64  # requests admitted at once (running or waiting)
    max_load: int = 65536  # row-calls admitted at once (module docstring)
    max_nfe: int = 256  # the largest NFE budget a request may ask for
    max_grid_points: int = 4096  # the largest master grid, nfe × rho points
    max_rows: int = 64  # rows of one request: prompts × n, doubled by prompt CFG
    max_readout_steps: int = 256  # recorded steps of one request (rows × readouts per row), stream only
    max_body_bytes: int = 1 << 20  # a request body larger than this is answered 413 before it is read
    request_timeout: float = 300.0  # seconds from admission to answer; then 408 and the request stops
    keepalive: float = 5.0  # seconds between keep-alive comments of a stream still sampling
    model_name: str = "elfreg"
    # the batcher's scheduler in a thread of its own; False: the owner runs server.batcher.run()
    # on the thread that loaded the model (elfreg.serve.threads.serve_here, as `elfreg serve` does)
    batcher_thread: bool = True

    def validate(self) -> ServeSettings:
        """One-line :class:`ValueError` naming the first bad setting (by its flag); returns self."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and not value > 0:
                raise ValueError(f"--{f.name.replace('_', '-')} must be > 0, got {value}")
        if self.max_load < self.max_rows * self.max_nfe:
            raise ValueError(f"--max-load ({self.max_load}) must be at least --max-rows × --max-nfe "
                             f"({self.max_rows * self.max_nfe} row-calls): a request within both limits must be "
                             "admissible on an idle server")
        return self


def request_rows(prompts: int, n: int, sample: SampleConfig) -> int:
    """Rows one request puts through each network call (module docstring)."""
    return prompts * n * (1 if sample.prompt_cfg == 1.0 else 2)


def recorded_steps(nfe: int, every: int) -> int:
    """Steps a trajectory recording every ``every``-th of ``nfe`` − 1 denoiser steps keeps (the
    last always; :class:`~elfreg.sampling.trajectory.TrajectoryRecorder`)."""
    steps = nfe - 1
    return len(set(range(0, steps, every)) | {steps - 1})


def check_cost(settings: ServeSettings, sample: SampleConfig, prompts: int, n: int, readouts: int,
               stream: bool) -> int:
    """The row-calls of one request (module docstring), or :class:`BadRequest` naming the first
    limit of ``settings`` it passes."""
    if sample.nfe > settings.max_nfe:
        raise BadRequest(f"nfe: {sample.nfe} is more than this server's limit of {settings.max_nfe} "
                         "(elfreg serve --max-nfe)", "nfe")
    if sample.nfe * sample.rho > settings.max_grid_points:
        raise BadRequest(f"rho: nfe × rho = {sample.nfe * sample.rho} master-grid points is more than this "
                         f"server's limit of {settings.max_grid_points} (elfreg serve --max-grid-points)", "rho")
    rows = request_rows(prompts, n, sample)
    if rows > settings.max_rows:
        cfg = " × 2 (prompt CFG)" if sample.prompt_cfg != 1.0 else ""
        raise BadRequest(f"n: {prompts} prompt(s) × n = {n}{cfg} is {rows} rows, more than this server's limit of "
                         f"{settings.max_rows} (elfreg serve --max-rows)", "n" if prompts == 1 else "prompt")
    if readouts:
        if not stream:
            raise BadRequest("readouts: early readouts are streamed; set stream to true", "readouts")
        if sample.trim:
            raise BadRequest("readouts: a trimmed canvas records no readouts; drop trim or readouts", "readouts")
        kept = prompts * n * recorded_steps(sample.nfe, readouts)
        if kept > settings.max_readout_steps:
            raise BadRequest(f"readouts: every {readouts} of {sample.nfe - 1} steps for {prompts * n} answer(s) "
                             f"records {kept} steps, more than this server's limit of {settings.max_readout_steps} "
                             "(elfreg serve --max-readout-steps)", "readouts")
    return rows * sample.nfe
