"""BatchedNetwork: concurrent jobs' calls merged into shared network calls, each job given exactly
its own rows, never more than max_batch rows a call, cancellation before the network, a failed
merged call run again job by job, every job's calls made on the scheduler's thread."""

from __future__ import annotations

import threading

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


def _steps(seed: int, rows: int, length: int = 5, reg: bool = True, steps: int = 3):
    """A job: ``steps`` denoise calls on its own inputs."""
    def job(net):
        args = _inputs(rows, seed, length, reg)
        return [net.denoise(*args) for _ in range(steps)]
    return job


def _expected(seed: int, rows: int, length: int = 5, reg: bool = True):
    z, _, t, w, _, r, _ = _inputs(rows, seed, length, reg)
    return 2 * z + (t * w)[:, None, None], None if r is None else r + 1


def _submit_all(net: BatchedNetwork, jobs: list) -> list:
    """Submit every job before the scheduler may start any (so that they share calls)."""
    with net._cond:  # the scheduler waits on this lock: it sees all jobs at once
        return [net.submit(job) for job in jobs]


def test_concurrent_jobs_share_calls_and_get_exactly_their_rows():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=16)
    try:
        shapes = [(seed, rows) for seed, rows in enumerate([1, 2, 3, 4])]
        futures = _submit_all(net, [_steps(seed, rows) for seed, rows in shapes])
        out = [f.result(30) for f in futures]
    finally:
        net.close()
    for (seed, rows), results in zip(shapes, out, strict=True):
        x_hat, reg_hat = _expected(seed, rows)
        for got_x, got_reg in results:
            torch.testing.assert_close(got_x, x_hat, rtol=0, atol=0)
            torch.testing.assert_close(got_reg, reg_hat, rtol=0, atol=0)
    # every step of the four jobs ran as one call of 1 + 2 + 3 + 4 rows
    assert stub.calls == [10, 10, 10] and net.stats.merged_calls == 12 and net.stats.rows == 30
    assert net.stats.calls == 3 and net.stats.seconds > 0


def test_a_job_submitted_later_joins_at_the_next_call():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=16)
    joined = {}

    def first(net_):
        args = _inputs(2, 0)
        out = [net_.denoise(*args)]
        joined["late"] = net.submit(_steps(1, 3, steps=2))  # starts before the next call
        out += [net_.denoise(*args) for _ in range(2)]
        return out

    try:
        head = net.submit(first)
        head.result(30)
        late = joined["late"].result(30)
    finally:
        net.close()
    assert stub.calls == [2, 5, 5]
    torch.testing.assert_close(late[-1][0], _expected(1, 3)[0], rtol=0, atol=0)


def test_no_call_exceeds_max_batch_and_shapes_that_differ_are_not_merged():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=4)
    try:
        shapes = [(0, 3, 5, True), (1, 3, 5, True), (2, 6, 5, True), (3, 2, 7, True), (4, 2, 5, False)]
        futures = _submit_all(net, [_steps(*shape, steps=2) for shape in shapes])
        out = [f.result(30) for f in futures]
    finally:
        net.close()
    assert max(stub.calls) <= 4 and sum(stub.calls) == 2 * (3 + 3 + 6 + 2 + 2)
    for shape, results in zip(shapes, out, strict=True):  # a 6-row call ran as 4 + 2, still exact
        x_hat, reg_hat = _expected(*shape)
        torch.testing.assert_close(results[-1][0], x_hat, rtol=0, atol=0)
        assert (results[-1][1] is None) == (reg_hat is None)


def test_a_cancelled_job_stops_before_the_network_and_a_network_that_always_fails_fails_every_job():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=8)
    cancel = threading.Event()

    def cancelled(net_):
        net_.decode(torch.ones(2, 3, 4), torch.zeros(2, 3, dtype=torch.bool), None, torch.ones(2))
        cancel.set()
        return net_.denoise(*_inputs(2, 0))

    try:
        with pytest.raises(RequestCancelled):
            net.submit(cancelled, cancel).result(30)
        assert stub.calls == [2] and net.active_jobs == 0
    finally:
        net.close()
    failing = BatchedNetwork(RowStub(fail=True), max_batch=8)
    try:
        futures = _submit_all(failing, [_steps(seed, 2, steps=1) for seed in range(3)])
        errors = [str(f.exception(30)) for f in futures]
    finally:
        failing.close()
    assert errors == ["the network failed"] * 3


class PoisonStub(RowStub):
    """A RowStub whose calls fail when they hold a row with a negative time (as a request's own
    rows can make a merged call fail: out of memory, a shape the network cannot take)."""

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.calls.append(z.shape[0])
        if (t < 0).any():
            raise RuntimeError("out of memory")
        return 2 * z + (t * w)[:, None, None], None if reg is None else reg + 1


def test_a_failed_merged_call_is_run_again_job_by_job_and_only_the_job_at_fault_fails():
    stub = PoisonStub()
    retried = []
    net = BatchedNetwork(stub, max_batch=16, on_retry=lambda: retried.append(1))

    def poisoned(net_):
        z, q, t, w, mask, reg, reg_q = _inputs(2, 9)
        return net_.denoise(z, q, -t, w, mask, reg, reg_q)

    try:
        jobs = [_steps(0, 1), _steps(1, 2), poisoned, _steps(2, 3)]
        futures = _submit_all(net, jobs)
        with pytest.raises(RuntimeError, match="out of memory"):
            futures[2].result(30)
        good = [futures[k].result(30) for k in (0, 1, 3)]
    finally:
        net.close()
    for (seed, rows), results in zip([(0, 1), (1, 2), (2, 3)], good, strict=True):
        x_hat, reg_hat = _expected(seed, rows)
        for got_x, got_reg in results:  # every step exact, the failed one included
            torch.testing.assert_close(got_x, x_hat, rtol=0, atol=0)
            torch.testing.assert_close(got_reg, reg_hat, rtol=0, atol=0)
    # the merged first step failed, ran again job by job (the poisoned job's call failing
    # alone), then the three good jobs shared their next two steps
    assert stub.calls == [8, 1, 2, 2, 3, 6, 6]
    assert net.stats.retried == len(retried) == 1


def test_a_job_that_raises_fails_alone():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=8)

    def broken(net_):
        net_.denoise(*_inputs(1, 0))
        raise ValueError("a bad request")

    try:
        bad, good = _submit_all(net, [broken, _steps(1, 2)])
        with pytest.raises(ValueError, match="a bad request"):
            bad.result(30)
        torch.testing.assert_close(good.result(30)[-1][0], _expected(1, 2)[0], rtol=0, atol=0)
    finally:
        net.close()


def test_max_batch_must_be_positive_and_the_network_is_for_jobs_only():
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        BatchedNetwork(RowStub(), max_batch=0)
    net = BatchedNetwork(RowStub())
    try:
        with pytest.raises(RuntimeError, match="from its jobs only"):
            net.denoise(*_inputs(1, 0))
    finally:
        net.close()


class ThreadRecordingStub(RowStub):
    """A RowStub that records which thread made each network call."""

    def __init__(self):
        super().__init__()
        self.threads: set[int] = set()

    def denoise(self, *args):
        self.threads.add(threading.get_ident())
        return super().denoise(*args)


def test_without_its_own_thread_the_jobs_run_on_the_thread_that_runs_the_scheduler():
    stub = ThreadRecordingStub()
    net = BatchedNetwork(stub, max_batch=16, own_thread=False)
    assert not net.owns_thread
    ran_on = set()

    def job(seed):
        def run(net_):
            ran_on.add(threading.get_ident())
            return _steps(seed, 2)(net_)
        return run

    futures = [net.submit(job(seed)) for seed in range(3)]  # queued before the scheduler runs
    closer = threading.Thread(target=lambda: ([f.result(30) for f in futures], net.close()))
    closer.start()
    net.run()  # this (main) thread runs every job and makes every network call until close()
    closer.join()
    assert stub.threads == ran_on == {threading.get_ident()} and stub.calls == [6, 6, 6]
    for seed, f in enumerate(futures):
        torch.testing.assert_close(f.result()[-1][0], _expected(seed, 2)[0], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="closed"):
        net.submit(_steps(0, 1))


def test_close_fails_the_jobs_not_yet_done():
    net = BatchedNetwork(RowStub(), max_batch=4, own_thread=False)
    parked = net.submit(_steps(0, 1))
    net.close()
    net.run()  # closed at once: fails what is queued
    with pytest.raises(RuntimeError, match="closed"):
        parked.result(5)


def test_serve_here_needs_a_batcher_that_runs_on_its_caller():
    from types import SimpleNamespace

    from elfreg.serve.threads import serve_here

    net = BatchedNetwork(RowStub(), max_batch=4)
    try:
        with pytest.raises(ValueError, match="batcher_thread=False"):
            serve_here(SimpleNamespace(batcher=net), None)
    finally:
        net.close()


def test_close_during_a_call_fails_the_jobs_at_their_next_call():
    net = None

    class ClosingStub(RowStub):
        def denoise(self, *args):
            net.close()  # as a SIGTERM's drain timing out would, while a call runs
            return super().denoise(*args)

    stub = ClosingStub()
    net = BatchedNetwork(stub, max_batch=8, own_thread=False)
    futures = [net.submit(_steps(seed, 1, steps=2)) for seed in range(2)]
    net.run()
    assert stub.calls == [2]
    for f in futures:
        with pytest.raises(RuntimeError, match="closed"):
            f.result(5)


def test_a_job_whose_future_is_cancelled_before_it_starts_never_runs():
    stub = RowStub()
    net = BatchedNetwork(stub, max_batch=8, own_thread=False)
    dropped, kept = net.submit(_steps(0, 1)), net.submit(_steps(1, 2))
    assert dropped.cancel()  # still waiting: the caller gave up (an asyncio wrapper's cancel)
    active_when_done = []
    kept.add_done_callback(lambda _f: (active_when_done.append(net.active_jobs), net.close()))
    net.run()
    assert dropped.cancelled() and stub.calls == [2, 2, 2]
    assert active_when_done == [0]  # a finished job has left the active set when its future is told
    assert not kept.cancel()  # once started a job's future cannot be cancelled under it
    torch.testing.assert_close(kept.result()[-1][0], _expected(1, 2)[0], rtol=0, atol=0)


def test_jobs_leaving_no_grad_in_any_order_leave_each_their_own_and_the_schedulers_autograd_mode():
    """Torch keeps the autograd mode per thread, and the jobs share the scheduler's: job 0 enters
    ``no_grad`` first and leaves it first, so without a mode per job the thread would end with
    the mode job 1 saw on entry (off), and a trainer on that thread would find gradients off."""
    net = BatchedNetwork(RowStub(), max_batch=16, own_thread=False)
    seen = {}

    def job(seed, calls):
        def run(net_):
            z, *rest = _inputs(1, seed)
            with torch.no_grad():
                for _ in range(calls):
                    z, _ = net_.denoise(z, *rest)
                    seen.setdefault(seed, []).append(torch.is_grad_enabled())
            return torch.is_grad_enabled()
        return run

    futures = [net.submit(job(0, 1)), net.submit(job(1, 3))]
    closer = threading.Thread(target=lambda: ([f.result(30) for f in futures], net.close()))
    closer.start()
    with torch.enable_grad():
        net.run()
        assert torch.is_grad_enabled()  # the scheduler's thread, as before it ran the jobs
    closer.join()
    assert seen == {0: [False], 1: [False, False, False]}  # inside their no_grad, whatever ran between
    assert [f.result() for f in futures] == [True, True]  # after it, each job's mode from before
