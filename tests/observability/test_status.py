"""The relay status shared by ``/explorer/status`` and ``/metrics``: lags, store size, peers."""

from __future__ import annotations

from pathlib import Path

from akrelay.backend import backend_for
from akrelay.explorer.views import status_page
from akrelay.federation.state import FederationState, PeerState
from akrelay.observability.routes import scrape
from akrelay.observability.sources import Sources
from akrelay.observability.status import relay_status
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import open_relay
from akrelay.settings import defaults
from akrelay.web import WebComponent
from tests.knowql.kq_harness import knowql_app


def test_peers_lag_and_errors_from_the_federation_state(tmp_path: Path) -> None:
    relay = open_relay(tmp_path, RelayConfig(origin="https://localhost:8443"))
    try:
        state = FederationState.open_in(tmp_path)
        peer = PeerState("https://peer.example", checkpoint=5, peer_checkpoint=12, last_error="refused <b>x</b>")
        peer.bump("failed_passes", 2)
        peer.bump("offers_accepted", 3)
        peer.bump("offers_refused", 1)
        state.put(peer)
        state.close()
        settings = defaults(peers=str(tmp_path / "peers.toml"), core_only=True)
        backend = backend_for(defaults(data=str(tmp_path)))  # the node's: it reads the data directory's state
        backend.bind(relay)
        sources = Sources(federation_state=backend.federation_state)
        status = relay_status(relay, settings, sources)
        assert [(p.origin, p.lag, p.failed_passes) for p in status.peers] == [("https://peer.example", 7, 2)]
        assert status.store_bytes and status.store_bytes > 0 and status.index_seq is None
        text = scrape(relay, settings, sources)[0].decode()
        assert 'akrelay_peer_sync_lag{peer="https://peer.example"} 7.0' in text
        assert 'akrelay_peer_sync_failed_passes_total{peer="https://peer.example"} 2.0' in text
        assert 'akrelay_peer_offers_total{outcome="accepted",peer="https://peer.example"} 3.0' in text
        assert 'akrelay_peer_offers_total{outcome="refused",peer="https://peer.example"} 1.0' in text
        assert 'akrelay_peer_offers_total{outcome="deferred",peer="https://peer.example"} 0.0' in text
        html = status_page(status, relay.config.origin)
        assert "refused &lt;b&gt;x&lt;/b&gt;" in html and "<b>x" not in html
    finally:
        relay.close()


def test_lags_count_records_not_yet_indexed(tmp_path: Path) -> None:
    with knowql_app(tmp_path) as kq:
        c = kq.corpus
        kq.submit(c.publish("alice", "One", "First."))
        web = kq.client.app.state.node.component("web", WebComponent)
        status = relay_status(kq.relay, kq.client.app.state.settings, web.sources)
        assert status.checkpoint == 1 and status.index_lag == 0


def test_explorer_pages_share_the_read_rate_limit(tmp_path: Path) -> None:
    with knowql_app(tmp_path, read_rate=0.001, read_burst=2) as kq:
        codes = [kq.client.get("/explorer/").status_code for _ in range(3)]
        assert codes[:2] == [200, 200] and codes[2] == 429
        assert kq.client.get("/v1/knowledge/query").status_code == 429  # the same bucket


def test_peers_come_from_the_deployment_state_on_redis(tmp_path: Path, redis_url: str) -> None:
    from akrelay.federation.redis_state import KEY_PREFIX, RedisFederationState
    from akrelay.leader import RedisLease
    from akrelay.store.redis.client import connect

    client = connect(redis_url)
    lease = RedisLease(client, KEY_PREFIX)
    assert lease.acquire()
    RedisFederationState(client, token=lease.token).put(PeerState("https://peer.example", checkpoint=2,
                                                                  peer_checkpoint=5))
    client.close()
    relay = open_relay(tmp_path, RelayConfig(origin="https://localhost:8443"))
    try:
        settings = defaults(peers=str(tmp_path / "peers.toml"), core_only=True, store=redis_url)
        backend = backend_for(defaults(data=str(tmp_path), store=redis_url))
        sources = Sources(federation_state=backend.federation_state)
        assert [(p.origin, p.lag) for p in relay_status(relay, settings, sources).peers] == [("https://peer.example", 3)]
    finally:
        relay.close()
        backend.close()
