"""KnowQL on Redis: two relay nodes share sessions and queries; an outage is a 503, not a 500."""

from __future__ import annotations

import logging
import time

from akrelay.knowql.redis_store import RedisTurnStore
from akrelay.backend import backend_for
from akrelay.knowql.store import SqliteTurnStore
from akrelay.settings import defaults
from redis_server import RedisServer

from .kq_harness import knowql_app


def _publish(kq) -> None:
    c = kq.corpus
    kq.submit(c.publish("alice", "Cache invalidation on restart", "Restarting the worker clears the LRU cache."))


def test_the_settings_pick_the_backend(redis_url, tmp_path) -> None:
    on_redis = backend_for(defaults(store=redis_url, data=str(tmp_path))).turn_store()
    on_file = backend_for(defaults(data=str(tmp_path))).turn_store()
    try:
        assert isinstance(on_redis, RedisTurnStore) and isinstance(on_file, SqliteTurnStore)
    finally:
        on_redis.close()
        on_file.close()


def test_a_session_started_on_one_node_continues_on_another(redis_url, tmp_path) -> None:
    with knowql_app(store=redis_url) as node_a, knowql_app(store=redis_url) as node_b:
        for kq in (node_a, node_b):  # each node here has a log of its own: only KnowQL state is shared
            _publish(kq)
        first = node_a.ask({"ask": "cache restart", "scope": ["knowledge"]}).json()
        assert first["status"] == "completed"
        assert node_b.client.get(f"/queries/{first['id']}").json() == first
        second = node_b.ask({"ask": "and then?", "session_id": first["session_id"]}).json()
        assert second["status"] == "completed" and second["previous_query_id"] == first["id"]
        session = node_a.client.get(f"/sessions/{first['session_id']}").json()
        assert [q["id"] for q in session["queries"]] == [first["id"], second["id"]]
        events = node_a.client.get(f"/queries/{second['id']}/events")
        assert events.status_code == 200 and "response.completed" in events.text
        counts = node_b.node.knowql.engine.store.status_counts()
        assert counts == {"completed": 2}
        assert node_b.client.delete(f"/sessions/{first['session_id']}").json() == {"deleted": True}
        assert node_a.client.get(f"/queries/{first['id']}").status_code == 404
    assert not (tmp_path / "knowql.sqlite3").exists()


def test_an_outage_of_the_session_store_is_a_503(tmp_path, caplog) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        with knowql_app(store=server.url) as kq:
            _publish(kq)
            doc = kq.ask({"ask": "cache restart", "scope": ["knowledge"]}).json()
            server.kill()
            started = time.monotonic()
            for answer in (kq.client.get(f"/queries/{doc['id']}"), kq.ask({"ask": "cache", "scope": ["knowledge"]})):
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["code"] == "service_unavailable"
                assert int(answer.headers["retry-after"]) >= 1
            assert time.monotonic() - started < 10
            server.start()
            assert kq.client.get(f"/queries/{doc['id']}").json() == doc
            # Redis away at shutdown, with a turn this node still runs: a warning, and the node stops.
            kq.node.knowql.engine._open.add("qry_unfinished")
            server.kill()
            caplog.clear()
    finally:
        server.kill()
    assert any("could not fail 1 unfinished turn" in r.getMessage() for r in caplog.records)
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)


def test_a_stream_ends_quietly_when_the_store_goes_away_mid_turn(caplog) -> None:
    import anyio

    from akrelay.knowql.sse import tail
    from akrelay.store.base import StoreUnavailable

    class Flaky:
        calls = 0

        def events(self, query_id, from_seq):
            self.calls += 1
            if self.calls > 1:
                raise StoreUnavailable("the KnowQL session store (Redis) is unreachable", 2)
            return [(1, "response.created", {"type": "response.created", "query_id": query_id})]

        def get_query(self, query_id):
            return {"id": query_id, "status": "in_progress"}

    async def collect():
        return [frame async for frame in tail(Flaky(), "qry_1")]

    frames = anyio.run(collect)
    assert len(frames) == 1 and frames[0].startswith(b"id: 1\nevent: response.created")
    assert any("ended early" in r.getMessage() for r in caplog.records)
