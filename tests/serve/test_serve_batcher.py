"""BatchedNetwork: concurrent samplers' calls merged into shared network calls, each caller given
exactly its own rows, never more than max_batch rows a call, cancellation before the network."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from elfreg.serve.batcher import BatchedNetwork, RequestCancelled


class RowStub:
    """A network whose output row depends on that row only (x̂ = 2z + t·w, REG = reg + 1), and
    which records the rows of every call."""

    reg_dim = 3

    def __init__(self, fail: bool = False):
        self.calls: list[int] = []
        self.fail = fail
        self.device = torch.device("cpu")

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.calls.append(z.shape[0])
        if self.fail:
            raise RuntimeError("the network failed")
        return 2 * z + (t * w)[:, None, None], None if reg is None else reg + 1

    def decode(self, x, prompt_mask, reg, w):
        self.calls.append(x.shape[0])
        return x.sum(-1).round().long()


def _inputs(rows: int, seed: int, length: int = 5, reg: bool = True):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, length, 4, generator=g)
    return (z, torch.zeros_like(z), torch.rand(rows, generator=g), torch.full((rows,), 2.0),
            torch.zeros(rows, length, dtype=torch.bool), torch.randn(rows, 3, generator=g) if reg else None, None)


def _threads(net: BatchedNetwork, jobs: list[tuple], steps: int = 3) -> dict[int, list]:
    """Each job (seed, rows, length, reg) runs ``steps`` denoise calls in its own session."""
    out: dict[int, list] = {}
    start = threading.Barrier(len(jobs))

    def run(k: int, seed: int, rows: int, length: int, reg: bool) -> None:
        args = _inputs(rows, seed, length, reg)
        with net.session():
            start.wait()
            out[k] = [net.denoise(*args) for _ in range(steps)]

    threads = [threading.Thread(target=run, args=(k, *job)) for k, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_callers_share_calls_and_get_exactly_their_rows():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=16, linger_s=0.05)
    try:
        jobs = [(seed, rows, 5, True) for seed, rows in enumerate([1, 2, 3, 4])]
        out = _threads(net, jobs)
    finally:
        net.close()
    for k, (seed, rows, length, reg) in enumerate(jobs):
        z, _, t, w, _, r, _ = _inputs(rows, seed, length, reg)
        for x_hat, reg_hat in out[k]:
            torch.testing.assert_close(x_hat, 2 * z + (t * w)[:, None, None], rtol=0, atol=0)
            torch.testing.assert_close(reg_hat, r + 1, rtol=0, atol=0)
    assert sum(stub.calls) == 30 and net.stats.merged_calls == 12


class GatedStub(RowStub):
    """A RowStub whose first call holds the network until ``release`` is set."""

    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def denoise(self, *args):
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(30)
        return super().denoise(*args)


def test_calls_queued_while_the_network_is_busy_run_as_one_call():
    stub = GatedStub()
    net = BatchedNetwork(stub, max_batch=16, linger_s=5.0)
    out: dict[int, tuple] = {}

    def one_call(k: int, rows: int) -> None:
        with net.session():
            out[k] = net.denoise(*_inputs(rows, k))

    first = threading.Thread(target=one_call, args=(0, 1))
    first.start()
    assert stub.entered.wait(30)  # the network is busy with the first caller's row
    rest = [threading.Thread(target=one_call, args=(k, k + 1)) for k in (1, 2, 3)]
    for t in rest:
        t.start()
    deadline = time.monotonic() + 30
    while net.queued_calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stub.release.set()
    for t in [first, *rest]:
        t.join(30)
    net.close()
    # the three calls that queued meanwhile share one network call (2 + 3 + 4 rows), each exact
    assert stub.calls == [1, 9]
    for k in range(4):
        z, _, t, w, _, r, _ = _inputs(k + 1, k)
        torch.testing.assert_close(out[k][0], 2 * z + (t * w)[:, None, None], rtol=0, atol=0)


def test_no_call_exceeds_max_batch_and_shapes_that_differ_are_not_merged():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=4, linger_s=0.05)
    try:
        jobs = [(0, 3, 5, True), (1, 3, 5, True), (2, 6, 5, True), (3, 2, 7, True), (4, 2, 5, False)]
        out = _threads(net, jobs, steps=2)
    finally:
        net.close()
    assert max(stub.calls) <= 4 and sum(stub.calls) == 2 * (3 + 3 + 6 + 2 + 2)
    for k, (seed, rows, length, reg) in enumerate(jobs):  # a 6-row call ran as 4 + 2, still exact
        z, _, t, w, _, r, _ = _inputs(rows, seed, length, reg)
        torch.testing.assert_close(out[k][-1][0], 2 * z + (t * w)[:, None, None], rtol=0, atol=0)
        assert (out[k][-1][1] is None) == (not reg)


def test_a_cancelled_session_stops_before_the_network_and_errors_reach_every_caller():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=8)
    try:
        cancel = threading.Event()
        with net.session(cancel):
            net.decode(torch.ones(2, 3, 4), torch.zeros(2, 3, dtype=torch.bool), None, torch.ones(2))
            cancel.set()
            with pytest.raises(RequestCancelled):
                net.denoise(*_inputs(2, 0))
        assert stub.calls == [2] and net.active_sessions == 0
    finally:
        net.close()
    failing = BatchedNetwork(RowStub(fail=True), max_batch=8, linger_s=0.05)
    errors = []

    def call(seed: int) -> None:
        with failing.session():
            try:
                failing.denoise(*_inputs(2, seed))
            except RuntimeError as err:
                errors.append(str(err))

    threads = [threading.Thread(target=call, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failing.close()
    assert errors == ["the network failed"] * 3


def test_max_batch_must_be_positive():
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        BatchedNetwork(RowStub(), max_batch=0)


class ThreadRecordingStub(RowStub):
    """A RowStub that records which thread made each network call."""

    def __init__(self):
        super().__init__()
        self.threads: set[int] = set()

    def denoise(self, *args):
        self.threads.add(threading.get_ident())
        return super().denoise(*args)


def test_without_its_own_thread_the_calls_run_on_the_thread_that_runs_the_scheduler():
    stub = ThreadRecordingStub()
    net = BatchedNetwork(stub, max_batch=16, linger_s=0.05, own_thread=False)
    assert not net.owns_thread
    out: dict[int, list] = {}

    def callers() -> None:
        try:
            out.update(_threads(net, [(seed, 2, 5, True) for seed in range(3)]))
        finally:
            net.close()  # run() below returns

    side = threading.Thread(target=callers)
    side.start()
    net.run()  # this (main) thread makes every network call until close()
    side.join()
    assert stub.threads == {threading.get_ident()} and sum(stub.calls) == 3 * 2 * 3
    for k in range(3):
        z, _, t, w, _, r, _ = _inputs(2, k)
        torch.testing.assert_close(out[k][-1][0], 2 * z + (t * w)[:, None, None], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="closed"):
        net.denoise(*_inputs(1, 0))


def test_a_sampling_thread_runs_its_own_torch_work_on_one_openmp_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the suite runs on one; a limit of one must be observable
    net = BatchedNetwork(RowStub(), max_batch=4)
    seen = {}

    def sample() -> None:
        seen["before"] = torch.get_num_threads()
        with net.session():
            seen["inside"] = torch.get_num_threads()
        seen["after"] = torch.get_num_threads()

    try:
        t = threading.Thread(target=sample)
        t.start()
        t.join()
        here = torch.get_num_threads()
    finally:
        net.close()
        torch.set_num_threads(threads)
    # OpenMP's thread count is per thread: the session's limit is its own, and undone after it
    assert seen == {"before": 2, "inside": 1, "after": 2} and here == 2


def test_serve_here_needs_a_batcher_that_runs_on_its_caller():
    from types import SimpleNamespace

    from elfreg.serve.threads import serve_here

    net = BatchedNetwork(RowStub(), max_batch=4)
    try:
        with pytest.raises(ValueError, match="batcher_thread=False"):
            serve_here(SimpleNamespace(batcher=net), None)
    finally:
        net.close()
