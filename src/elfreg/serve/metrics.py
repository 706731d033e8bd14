"""``elfreg serve``'s Prometheus metrics (``GET /metrics``), one registry per server.

Contract: every HTTP answer is counted once in ``elfreg_requests_total{route,status}``, whoever
made it (a route, the body limit, FastAPI's own 404 and 405, a stream that ended in an error);
``route`` is one of the served routes or ``other``, so a client sending arbitrary paths cannot
grow the metric without bound.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


class Metrics:
    """The metrics of one server; ``batcher_state()`` gives (calls waiting for the network,
    requests sampling) when scraped."""

    def __init__(self, batcher_state: Callable[[], tuple[int, int]]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("elfreg_requests", "requests answered, by route and status", ["route", "status"],
                                registry=r)
        self.in_flight = Gauge("elfreg_requests_in_flight", "requests admitted and not yet answered", registry=r)
        self.load = Gauge("elfreg_load_in_flight", "admitted work not yet done: rows × network calls of every "
                          "request admitted (elfreg serve --max-load bounds it)", registry=r)
        Gauge("elfreg_queued_calls", "sampler calls waiting for the network", registry=r).set_function(
            lambda: batcher_state()[0])
        Gauge("elfreg_sampling_requests", "requests sampling (started, not yet answered by the sampler)",
              registry=r).set_function(lambda: batcher_state()[1])
        self.calls = Counter("elfreg_network_calls", "network calls made (rate: calls per second)", registry=r)
        self.busy = Counter("elfreg_network_seconds", "seconds spent in network calls (rate: the share of time "
                            "the network is busy)", registry=r)
        self.retried = Counter("elfreg_network_retried_calls", "merged network calls that failed and were run "
                               "again one request at a time", registry=r)
        self.rows = Histogram("elfreg_rows_per_call", "rows of each network call", registry=r,
                              buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.latency = Histogram("elfreg_request_latency_seconds", "time from admission to answer", ["route"],
                                 registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))

    def on_call(self, rows: int, seconds: float) -> None:
        self.calls.inc()
        self.busy.inc(seconds)
        self.rows.observe(rows)

    def answered(self, path: str, status: int) -> None:
        """Count one HTTP answer (module docstring)."""
        self.requests.labels(path if path in ROUTES else "other", str(status)).inc()
