"""Prometheus metrics of the calls a worker runs: ``toolexec worker --metrics-port N``.

Flower's own ``/metrics`` counts Celery events; these count what only the
executor knows: outcomes by error type, attempts and retries, the latency a
caller waits, fallbacks taken and payloads offloaded, and breaker states.

* Call counters and histograms live in the worker process that runs the call
  (:class:`Metrics`, fed by the task's observer hooks). With the threads pool
  (the default) that is the process serving ``/metrics``. With prefork every
  child writes to prometheus_client's multiprocess files and the parent serves
  their sum: ``toolexec worker`` sets ``PROMETHEUS_MULTIPROC_DIR`` to a fresh
  directory before anything imports prometheus_client.
* Breaker states are read from Redis when Prometheus scrapes (one round trip),
  so every worker reports the fleet-wide state of every breaker, however it
  changed; transitions this process caused are counted from the breaker's
  listeners.
* :class:`Metrics` is a :class:`toolexec.pipeline.observe.Reporter`: ``toolexec
  worker`` registers it (:func:`install`), and the worker's runtime feeds it
  the task's observer hooks, fallbacks, offloads, dropped writes and breaker
  transitions. Nothing in the worker's core imports this module, so
  prometheus_client stays the optional ``ops`` extra.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from toolexec.breaker import BreakerState, CircuitBreaker, Transition
from toolexec.tracing import trace_exemplar

__all__ = [
    "BreakerCollector",
    "Metrics",
    "QueueDepthCollector",
    "install",
    "metrics",
    "multiprocess_dir",
    "record_fallback",
    "record_offload",
    "serve",
]

log = logging.getLogger("toolexec.ops.metrics")

#: Tool calls take milliseconds (a cache) to minutes (a crawl).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

#: Attempts whose start was seen but whose end never came (a bug elsewhere) are
#: forgotten beyond this many, so the start times cannot grow without bound.
_MAX_TRACKED = 10_000


def multiprocess_dir() -> str | None:
    """The directory of prometheus_client's multiprocess mode, when it is on."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    """One process's metric objects, and the observer hooks that feed them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.calls = Counter(
            "toolexec_calls",
            "Calls that ended, by outcome: ok or the error type.",
            ["tool", "outcome"],
            registry=r,
        )
        self.attempts = Counter(
            "toolexec_attempts",
            "Attempts that ended in a retry or a result (not deferred, not answered elsewhere).",
            ["tool"],
            registry=r,
        )
        self.retries = Counter(
            "toolexec_retries",
            "Attempts that ended in a retry, by the error that caused it.",
            ["tool", "error_type"],
            registry=r,
        )
        self.call_seconds = Histogram(
            "toolexec_call_duration_seconds",
            "From submission to the final result (queueing, attempts, backoff): the caller's wait.",
            ["tool"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.attempt_seconds = Histogram(
            "toolexec_attempt_duration_seconds",
            "One attempt in the worker, layers included.",
            ["tool"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "toolexec_calls_in_flight",
            "Attempts running now.",
            ["tool"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.transitions = Counter(
            "toolexec_breaker_transitions",
            "Breaker state changes this process caused, by the state entered.",
            ["breaker", "state"],
            registry=r,
        )
        self.fallbacks = Counter(
            "toolexec_fallbacks",
            "Calls answered by a fallback after the tool failed, by the fallback's source.",
            ["tool", "source"],
            registry=r,
        )
        self.offloads = Counter(
            "toolexec_offloaded_payloads",
            "Results or arguments too large to travel inline, stored and passed by reference.",
            ["tool", "kind"],
            registry=r,
        )
        self.offloaded_bytes = Counter(
            "toolexec_offloaded_bytes",
            "Bytes of the payloads stored instead of travelling inline.",
            ["tool", "kind"],
            registry=r,
        )
        self.budget_spent = Counter(
            "toolexec_retry_budget_spent",
            "Retries the fleet's retry budget let through (each one spends from it).",
            ["tool"],
            registry=r,
        )
        self.budget_refused = Counter(
            "toolexec_retry_budget_refused",
            "Retries the retry budget refused: the call ended retry_budget_exhausted.",
            ["tool"],
            registry=r,
        )
        self.writes_dropped = Counter(
            "toolexec_writes_dropped",
            "Worker writes beside an answer (breaker and budget records, stats) given up "
            "because Redis stayed unreachable until the call's deadline.",
            ["write"],
            registry=r,
        )
        self._starts: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _of(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept per label values.

        prometheus_client's ``labels()`` checks the values and takes the metric's
        lock on each call, six times a call here; the child it returns is the
        same object every time (these metrics never remove one), so it is kept.
        """
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- observer hooks (see toolexec.pipeline.observe) ------------------------------

    def started(self, tool: str, call_id: str, attempt: int, lease_until: float) -> None:
        self._of(self.in_flight, tool).inc()
        with self._lock:
            if len(self._starts) >= _MAX_TRACKED:
                self._starts.clear()
            self._starts[call_id, attempt] = time.monotonic()

    def retrying(self, tool: str, call_id: str, attempt: int, error_type: str) -> None:
        self._ended(tool, call_id, attempt, counted=True)
        self.retries.labels(tool, error_type).inc()
        self.budget_spent.labels(tool).inc()

    def finished(
        self, tool: str, call_id: str, attempt: int, error_type: str | None, elapsed_s: float
    ) -> None:
        self._ended(tool, call_id, attempt, counted=True)
        self._of(self.calls, tool, error_type or "ok").inc()
        if error_type == "retry_budget_exhausted":
            self.budget_refused.labels(tool).inc()
        # OpenMetrics exemplar: from a slow bucket straight to the trace of a slow call
        self._of(self.call_seconds, tool).observe(elapsed_s, exemplar=trace_exemplar())

    def withdrawn(self, tool: str, call_id: str, attempt: int) -> None:
        self._ended(tool, call_id, attempt, counted=False)

    def _ended(self, tool: str, call_id: str, attempt: int, *, counted: bool) -> None:
        with self._lock:
            start = self._starts.pop((call_id, attempt), None)
        if start is not None:  # a start this process saw: the gauge went up here
            self._of(self.in_flight, tool).dec()
        if counted:
            self._of(self.attempts, tool).inc()
            if start is not None:
                self._of(self.attempt_seconds, tool).observe(time.monotonic() - start)

    def on_transition(self, transition: Transition) -> None:
        """A breaker listener (:meth:`CircuitBreaker.add_listener`)."""
        self.transitions.labels(transition.name, str(transition.to_state)).inc()

    def fell_back(self, tool: str, source: str) -> None:
        self.fallbacks.labels(tool, source).inc()

    def offloaded(self, tool: str, size_bytes: int, kind: str) -> None:
        self.offloads.labels(tool, kind).inc()
        self.offloaded_bytes.labels(tool, kind).inc(size_bytes)

    def write_dropped(self, write: str) -> None:
        self.writes_dropped.labels(write).inc()


_metrics: Metrics | None = None
_metrics_lock = threading.Lock()


def metrics() -> Metrics:
    """This process's metrics, created on first use."""
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            _metrics = Metrics()
        return _metrics


def install() -> None:
    """Have this process's worker runtimes report to :func:`metrics` (``toolexec worker``).

    Registered as a factory: a prefork child makes its own metrics when its
    runtime is built, after the fork.
    """
    from toolexec.pipeline.observe import add_reporter

    add_reporter(metrics)


def record_fallback(tool: str, source: str) -> None:
    """A call of ``tool`` was answered by a fallback (``source``: its tool or cache)."""
    metrics().fell_back(tool, source)


def record_offload(tool: str, size_bytes: int, kind: str = "result") -> None:
    """A ``kind`` (result or arguments) of ``tool`` was stored instead of travelling inline."""
    metrics().offloaded(tool, size_bytes, kind)


class BreakerCollector:
    """``toolexec_breaker_state{breaker,state}``: 1 for each breaker's state now, read on scrape.

    A scrape while Redis is away reports no breaker series rather than failing
    the whole page: the call metrics still matter then.
    """

    def __init__(self, breakers: CircuitBreaker) -> None:
        self.breakers = breakers

    def describe(self) -> list[Metric]:
        return []  # states are read on scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "toolexec_breaker_state",
            "1 for the state each circuit breaker is in now (fleet-wide, read from Redis).",
            labels=["breaker", "state"],
        )
        try:
            views = self.breakers.snapshot_all()
        except Exception as exc:  # never fail a scrape over one source
            log.warning("breaker states left out of /metrics: %s", exc)
            views = []
        for view in views:
            for state in BreakerState:
                family.add_metric([view.name, str(state)], 1.0 if view.state is state else 0.0)
        yield family


class QueueDepthCollector:
    """``toolexec_queue_depth{queue}``: messages waiting in each tool queue, read on scrape.

    Read from the broker when Prometheus scrapes, like ``toolexec status`` does,
    so every worker reports the same fleet-wide depth; a broker that does not
    answer leaves the series out rather than failing the page.
    """

    def __init__(self, depths: Callable[[], Mapping[str, int | None]]) -> None:
        self.depths = depths

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "toolexec_queue_depth",
            "Messages waiting in each tool queue (not yet delivered to a worker).",
            labels=["queue"],
        )
        try:
            depths = dict(self.depths())
        except Exception as exc:  # never fail a scrape over one source
            log.warning("queue depths left out of /metrics: %s", exc)
            depths = {}
        for name, count in sorted(depths.items()):
            if count is not None:
                family.add_metric([name], float(count))
        yield family


class LaneCollector:
    """What waits in each queue's fairness lanes (``toolexec.transport.lanes``), read on scrape.

    ``toolexec_lane_waiting{queue,priority}`` and ``toolexec_lane_oldest_seconds``
    per priority, and ``toolexec_fairness_key_waiting{queue,priority,key}`` for the
    keys with the most calls waiting only (``fairness_store.TOP_KEYS``): a fleet
    of 100 000 tenants must not become 100 000 series.
    """

    def __init__(self, lanes: Callable[[], Mapping[str, Any]]) -> None:
        self.lanes = lanes

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily(
            "toolexec_lane_waiting",
            "Calls waiting in a queue's lanes per priority (1 most urgent).",
            labels=["queue", "priority"],
        )
        oldest = GaugeMetricFamily(
            "toolexec_lane_oldest_seconds",
            "Age of the oldest call waiting at each priority.",
            labels=["queue", "priority"],
        )
        keys = GaugeMetricFamily(
            "toolexec_fairness_key_waiting",
            "Calls waiting per fairness key, for the keys with the most only.",
            labels=["queue", "priority", "key"],
        )
        try:
            views = dict(self.lanes())
        except Exception as exc:  # never fail a scrape over one source
            log.warning("fairness lanes left out of /metrics: %s", exc)
            views = {}
        for queue, view in sorted(views.items()):
            for priority, (count, age) in view.priorities.items():
                waiting.add_metric([queue, str(priority)], float(count))
                if age is not None:
                    oldest.add_metric([queue, str(priority)], float(age))
            for backlog, _ in view.top:
                labels = [queue, str(backlog.priority), backlog.key or "(none)"]
                keys.add_metric(labels, float(backlog.waiting))
        yield from (waiting, oldest, keys)


def serve(
    port: int,
    addr: str,
    breakers: CircuitBreaker | None = None,
    depths: Callable[[], Mapping[str, int | None]] | None = None,
    lanes: Callable[[], Mapping[str, Any]] | None = None,
) -> Any:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns the server.

    In multiprocess mode the page is the sum of every process's files;
    otherwise it is this process's :func:`metrics`.
    """
    folder = multiprocess_dir()
    if folder:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=folder)  # type: ignore[no-untyped-call]
    else:
        registry = metrics().registry
    if breakers is not None:
        registry.register(BreakerCollector(breakers))
    if depths is not None:
        registry.register(QueueDepthCollector(depths))
    if lanes is not None:
        registry.register(LaneCollector(lanes))
    server, _ = start_http_server(port, addr=addr, registry=registry)
    return server
