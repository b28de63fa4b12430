"""Prometheus metrics (``prometheus-client``), correct across Granian workers.

Counters and histograms are per process; with ``PROMETHEUS_MULTIPROC_DIR`` set
(by :func:`prepare_multiprocess` in the launcher, before any worker starts) each
worker writes them to its own memory-mapped files and ``GET /metrics`` sums all
workers' files (the library's multi-process mode). Without it (tests, embedded
apps) they live in the process registry. Values that describe the relay rather
than the requests (checkpoint, lags, store size, peers, KnowQL turns) are read at
scrape time (:mod:`akrelay.observability.routes`), so no worker has to keep them current.
This module depends on nothing of akrelay's: the HTTP layer counts through it.

``prometheus_client`` is imported lazily: it picks its value class from the
environment at import, so the launcher must set the directory first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
METRICS_DIR = "metrics"
#: Request latency buckets (seconds): ingest answers in well under a millisecond, KnowQL in seconds.
#: Store round-trip buckets (seconds): a Redis call with its fsync takes ~0.2-5 ms; a stall shows in the tail.
STORE_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 3.0)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def prepare_multiprocess(data_dir: Path | None) -> Path:
    """Point the library's multi-process mode at an empty directory (launcher, before workers start).

    Under the data directory when there is one (a restart starts from zero: stale
    files of dead workers would otherwise be summed), else a new temporary directory.
    """
    if data_dir is not None:
        path = Path(data_dir) / METRICS_DIR
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
    else:
        path = Path(tempfile.mkdtemp(prefix="akrelay-metrics-"))
    os.environ[MULTIPROC_ENV] = str(path)
    return path


class _Metrics:
    """The per-process metric objects, created on first use; children pre-bound for the hot path."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus-client leaves it unannotated; *_created series would double the exposition for no alerting use
        self.registry = registry = CollectorRegistry()
        self.accepted = Counter("akrelay_events_accepted", "Events newly accepted (committed with a new seq), by type",
                                ["type"], registry=registry)
        self.duplicates = Counter("akrelay_events_duplicate", "Exact resubmissions answered with the retained record",
                                  registry=registry)
        self.refused = Counter("akrelay_events_refused", "Submissions refused, by error code", ["code"],
                               registry=registry)
        self.rate_limited = Counter("akrelay_rate_limited", "Requests refused with 429, by rate bucket", ["bucket"],
                                    registry=registry)
        self.requests = Histogram("akrelay_request_duration_seconds", "Request latency by route template",
                                  ["route", "method", "status"], buckets=LATENCY_BUCKETS, registry=registry)
        self.store_calls = Histogram("akrelay_store_call_duration_seconds",
                                     "Round trips to a network store (Redis), by call", ["call"],
                                     buckets=STORE_BUCKETS, registry=registry)
        self.store_unavailable = Counter("akrelay_store_unavailable",
                                         "Calls to a network store that failed as an outage (answered 503)",
                                         registry=registry)
        self.rate_local = Counter("akrelay_rate_limit_local_decisions",
                                  "Tokens decided by a worker's own bucket while Redis was unreachable or refused writes",
                                  ["bucket"], registry=registry)
        self.reconcile_messages = Counter(
            "akrelay_reconcile_messages", "Reconciliation messages answered, by what answered them (copy: the kept "
            "copy in memory; store: the store's aggregates)", ["answered_from"], registry=registry)
        self.reconcile_copies = Counter(
            "akrelay_reconcile_copies", "Copies of the whole reconciliation set the keepers made (at start, and after "
            "a withholding or a removal)", registry=registry)
        self._accepted: dict[str, Counter] = {}
        self._store_calls: dict[str, Histogram] = {}
        self._refused: dict[str, Counter] = {}
        self._requests: dict[tuple[str, str, int], Histogram] = {}

    def accept(self, event_type: str) -> None:
        child = self._accepted.get(event_type)
        if child is None:
            child = self._accepted[event_type] = self.accepted.labels(event_type)
        child.inc()

    def refuse(self, code: str) -> None:
        child = self._refused.get(code)
        if child is None:
            child = self._refused[code] = self.refused.labels(code)
        child.inc()

    def store_call(self, call: str, seconds: float) -> None:
        child = self._store_calls.get(call)
        if child is None:
            child = self._store_calls[call] = self.store_calls.labels(call)
        child.observe(seconds)

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(route, method, str(status))
        child.observe(seconds)


class StoreObserver:
    """Round trips to a network store and its outages, counted here (the ``observer`` of a Redis log, set by the backend)."""

    def call(self, name: str, seconds: float) -> None:
        metrics().store_call(name, seconds)

    def outage(self) -> None:
        metrics().store_unavailable.inc()


_metrics: _Metrics | None = None
_create = threading.Lock()


def metrics() -> _Metrics:
    global _metrics
    if _metrics is None:
        with _create:
            if _metrics is None:
                _metrics = _Metrics()
    return _metrics
