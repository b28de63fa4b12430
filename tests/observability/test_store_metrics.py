"""``/metrics`` on a Redis log: store round trips, outages, Redis memory, and a scrape that works during an outage."""

from __future__ import annotations

from akrelay.process.worker import create_app
from akrelay.observability.routes import scrape
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.settings import defaults
from akrelay.store.redis.store import RedisStore
from litestar.testing import TestClient
from redis_server import RedisServer
from tests.http.relay_harness import NOW, ORIGIN, Clock, Harness
from tests.observability.test_metrics import value


def test_store_calls_outages_and_memory_reach_the_metrics(tmp_path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        settings = defaults(store=server.url)
        clock = Clock(NOW)
        relay = Relay(RedisStore(server.url), RelayConfig(origin=ORIGIN), clock=clock, cursor_secret=b"k" * 32)
        app = create_app(relay, settings, components=())
        with TestClient(app, raise_server_exceptions=False) as client:
            h = Harness(client, relay, clock, settings, app.state.node)
            before = scrape(relay, settings)[0].decode()
            assert h.submit_fixture("original").status_code == 200
            text = scrape(relay, settings)[0].decode()
            calls = value(text, "akrelay_store_call_duration_seconds_count", call="commit") - value(
                before, "akrelay_store_call_duration_seconds_count", call="commit")
            assert calls == 1
            assert value(text, "akrelay_store_up") == 1
            assert value(text, "akrelay_store_memory_bytes") > 0
            assert value(text, "akrelay_store_memory_limit_bytes") == 0  # the test server sets no maxmemory
            server.kill()
            assert h.submit_fixture("branch_left").status_code == 503
            down = scrape(relay, settings)[0].decode()  # no exception: the counters still go out
            assert value(down, "akrelay_store_up") == 0
            assert value(down, "akrelay_store_unavailable_total") > value(text, "akrelay_store_unavailable_total")
        relay.close()
    finally:
        server.kill()
