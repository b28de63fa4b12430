"""``GET /metrics`` (mounted by the node's web component, ``akrelay.web``): the Prometheus text exposition.

Every worker's counters (:mod:`akrelay.observability.metrics`) plus gauges read
from the relay at scrape time by :class:`RelayCollector`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterator

import anyio.to_thread
from litestar import get
from litestar.response.base import ASGIResponse

import akrelay.observability.options  # noqa: F401  (declares --log-json)
from akrelay.observability.sources import Sources
from akrelay.observability.status import relay_status
from akrelay.observability.metrics import MULTIPROC_ENV, metrics
from akrelay.store.base import StoreUnavailable

if TYPE_CHECKING:
    from litestar.handlers import HTTPRouteHandler
    from prometheus_client import Metric

    from akrelay.relay.core import Relay
    from akrelay.settings import Settings

METRICS_PATH = "/metrics"


def scrape(relay: Relay, settings: Settings, sources: Sources | None = None) -> tuple[bytes, str]:
    """The text exposition of every worker's counters plus the relay's current state."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    own = metrics().registry
    registry = CollectorRegistry()
    if os.environ.get(MULTIPROC_ENV):
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # unannotated upstream; every worker's files, this one's included
    else:
        registry.register(own)
    registry.register(RelayCollector(relay, settings, sources if sources is not None else Sources()))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class RelayCollector:
    """Gauges read from the relay at scrape time (one snapshot of :func:`relay_status`)."""

    def __init__(self, relay: Relay, settings: Settings, sources: Sources) -> None:
        self.relay = relay
        self.settings = settings
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            status = relay_status(self.relay, self.settings, self.sources)
        except StoreUnavailable:  # the counters still go out: an outage is when they are needed most
            yield GaugeMetricFamily("akrelay_store_up", "1 when the store answered this scrape, else 0", value=0)
            return
        yield GaugeMetricFamily("akrelay_store_up", "1 when the store answered this scrape, else 0", value=1)
        if status.store_memory is not None:
            used, limit = status.store_memory
            yield GaugeMetricFamily("akrelay_store_memory_bytes", "Memory the network store (Redis) uses",
                                    value=used)
            yield GaugeMetricFamily("akrelay_store_memory_limit_bytes",
                                    "The network store's memory limit (Redis maxmemory; 0: none)", value=limit)
        yield GaugeMetricFamily("akrelay_checkpoint", "Highest committed acceptance seq", value=status.checkpoint)
        if status.index_lag is not None:
            yield GaugeMetricFamily("akrelay_search_index_lag", "Accepted records not yet in the search index (seq)",
                                    value=status.index_lag)
        if status.text_index_lag is not None:
            yield GaugeMetricFamily("akrelay_text_index_lag",
                                    "Records in the log not yet in this node's q trigram index (q scans them)",
                                    value=status.text_index_lag)
        if status.kip_lag is not None:
            yield GaugeMetricFamily("akrelay_kip_import_lag", "Accepted records not yet imported into the KIP nexus (seq)",
                                    value=status.kip_lag)
        if status.store_bytes is not None:
            yield GaugeMetricFamily("akrelay_store_bytes", "Size of the store's files in bytes", value=status.store_bytes)
        lag = GaugeMetricFamily("akrelay_peer_sync_lag", "Peer seqs observed but not yet processed", labels=["peer"])
        errors = CounterMetricFamily("akrelay_peer_sync_failed_passes", "Failed sync passes per peer", labels=["peer"])
        misbehaving = GaugeMetricFamily("akrelay_peer_misbehaving",
                                        "1 when the peer's signed Merkle log did not verify (fork, rewrite, missing "
                                        "record); it is no longer pulled from", labels=["peer"])
        offers = CounterMetricFamily("akrelay_peer_offers",
                                     "Events offered to the peer after reconciliation (issue 26), by outcome: "
                                     "accepted, refused (4xx, not offered again), deferred (left for later)",
                                     labels=["peer", "outcome"])
        for peer in status.peers:
            for outcome in ("accepted", "refused", "deferred"):
                offers.add_metric([peer.origin, outcome], (peer.offers or {}).get(f"offers_{outcome}", 0))
            lag.add_metric([peer.origin], peer.lag)
            errors.add_metric([peer.origin], peer.failed_passes)
            misbehaving.add_metric([peer.origin], 1 if peer.misbehaving else 0)
        yield lag
        yield errors
        yield misbehaving
        yield offers
        turns = _knowql_counts(self.sources)
        if turns is not None:
            family = GaugeMetricFamily("akrelay_knowql_turns", "KnowQL turns in the turn store, by status",
                                       labels=["status"])
            for name in ("in_progress", "completed", "failed", "cancelled"):
                family.add_metric([name], turns.get(name, 0))
            yield family


def _knowql_counts(sources: Sources) -> dict[str, int] | None:
    try:
        return sources.knowql_turn_counts()
    except Exception:  # noqa: BLE001 - a scrape reports what it can
        return None


def routes(relay: Relay, settings: Settings, sources: Sources) -> list[HTTPRouteHandler]:
    @get(METRICS_PATH, include_in_schema=False)
    async def metrics_page() -> ASGIResponse:
        body, content_type = await anyio.to_thread.run_sync(scrape, relay, settings, sources)
        return ASGIResponse(body=body, status_code=200, media_type=content_type)

    return [metrics_page]
