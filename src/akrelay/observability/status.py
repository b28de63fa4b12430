"""One snapshot of the relay's operational state, shared by the status page and ``/metrics``.

Every part is best effort: a component that is not installed or not open yet is
reported as ``None`` rather than failing the page or the scrape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from akrelay.observability.sources import Sources
from akrelay.store.capabilities import FileBacked, MemoryReporting, TextIndexed, store_directory

if TYPE_CHECKING:
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings

#: The per-peer counters of offers after reconciliation (``akrelay.federation.state.COUNTERS`` names them too).
OFFER_COUNTERS = ("offered", "offers_accepted", "offers_refused", "offers_deferred")


@dataclass(slots=True)
class PeerStatus:
    origin: str
    checkpoint: int
    peer_checkpoint: int
    lag: int
    failed_passes: int
    passes: int
    last_error: str | None
    last_success: int | None
    #: why its signed Merkle log did not verify (issue 23), else None
    misbehaving: str | None = None
    #: offers after reconciliation (issue 26): offered, offers_accepted, offers_refused, offers_deferred
    offers: dict[str, int] | None = None


@dataclass(slots=True)
class RelayStatus:
    checkpoint: int
    index_seq: int | None = None
    kip_head: int | None = None
    store_bytes: int | None = None
    #: a network store's memory in use and its limit (0: none), e.g. Redis ``used_memory``/``maxmemory``
    store_memory: tuple[int, int] | None = None
    #: records in the log not yet in the store's trigram text index (``q`` scans those); ``None``: no such index
    text_index_lag: int | None = None
    peers: list[PeerStatus] = field(default_factory=list)

    @property
    def index_lag(self) -> int | None:
        return None if self.index_seq is None else max(0, self.checkpoint - self.index_seq)

    @property
    def kip_lag(self) -> int | None:
        return None if self.kip_head is None else max(0, self.checkpoint - self.kip_head)


def _data_dir(relay: Relay) -> Path | None:
    """The node's data directory (also with a Redis store, where it holds only derived state)."""
    data_dir = relay.data_dir
    if data_dir is not None:
        return Path(data_dir)
    return store_directory(relay.store)


def _store_bytes(relay: Relay) -> int | None:
    path = relay.store.path if isinstance(relay.store, FileBacked) else None
    if path is None:
        return None
    total = 0
    for suffix in ("", "-wal", "-shm"):
        try:
            total += os.stat(str(path) + suffix).st_size
        except OSError:
            pass
    return total


def _store_memory(relay: Relay) -> tuple[int, int] | None:
    if not isinstance(relay.store, MemoryReporting):
        return None
    try:
        return relay.store.memory()
    except Exception:  # noqa: BLE001 - best effort: an outage shows as akrelay_store_up 0 instead
        return None


def _text_index_lag(relay: Relay) -> int | None:
    if not isinstance(relay.store, TextIndexed):
        return None
    try:
        return int(relay.store.text_index_lag())
    except Exception:  # noqa: BLE001 - best effort, as the memory gauge
        return None


def _index_seq(sources: Sources) -> int | None:
    try:
        return sources.search_position()
    except Exception:  # noqa: BLE001 - the status is best effort: an index that cannot open reads as absent
        return None


def _kip_head(sources: Sources) -> int | None:
    try:
        return sources.kip_head()
    except Exception:  # noqa: BLE001 - best effort, as above
        return None


def _peers(settings: Settings, sources: Sources) -> list[PeerStatus]:
    if not settings.federation.peers:
        return []
    try:
        state = sources.open_federation_state()  # the backend's: the data directory's, or the deployment's
        if state is None:
            return []
        try:
            return [PeerStatus(p.origin, p.checkpoint, p.peer_checkpoint, p.lag, p.counts.get("failed_passes", 0),
                               p.counts.get("passes", 0), p.last_error, p.last_success, p.misbehaving,
                               {k: p.counts.get(k, 0) for k in OFFER_COUNTERS})
                    for p in state.all()]
        finally:
            state.close()
    except Exception:  # noqa: BLE001 - a federation state that cannot be read shows no peers
        return []


def relay_status(relay: Relay, settings: Settings, sources: Sources | None = None) -> RelayStatus:
    """The checkpoint, index and KIP positions, store size and peers of ``relay``, now (``sources``: the
    node's components and federation state, as :class:`akrelay.web.WebComponent` has them)."""
    sources = sources if sources is not None else Sources()
    return RelayStatus(checkpoint=relay.checkpoint(), index_seq=_index_seq(sources), kip_head=_kip_head(sources),
                       store_bytes=_store_bytes(relay), store_memory=_store_memory(relay),
                       text_index_lag=_text_index_lag(relay), peers=_peers(settings, sources))
