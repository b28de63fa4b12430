"""A Redis that answers but refuses writes (full, unable to persist, a replica) is an outage, not a bug (issue 24 item 8).

Each case runs its own ``redis-server`` and provokes the fault for real: ``maxmemory`` with
``noeviction`` after filling it (``OOM``), a failed snapshot with ``save`` on (``MISCONF``), and
``REPLICAOF`` a primary that is not there (``READONLY``). Writes answer 503 with ``Retry-After``,
reads keep answering 200 (the rate limits fall back to each worker's own bucket), nothing logs a
traceback, and writes work again once the fault is cleared.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis
import redis.exceptions
from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.settings import defaults
from akrelay.store.redis.client import DOWN, REFUSING, is_outage, outage_kind, outage_reason, unavailable
from akrelay.store.base import StoreUnavailable
from redis_server import RedisServer, free_port

from test_redis_node import HEADERS, publication

KNOWQL = json.dumps({"ask": "what was published?", "scope": ["knowledge"], "retrieval_only": True})


def _fill_until_full(client: redis.Redis) -> None:
    """``maxmemory`` a little above what is used, ``noeviction``, then write until Redis refuses."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 256 * 1024))
    for n in range(10_000):
        try:
            client.set(f"filler:{n}", b"x" * 8192)
        except redis.exceptions.OutOfMemoryError:
            break
    else:
        raise AssertionError("Redis never reported it was full")
    # Full by a hair is not full for long: freed client buffers or an expired rate-limit bucket can bring
    # used memory back under the limit and let the next write through (CI saw this). Well under what is
    # used, Redis stays full until the limit is lifted.
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) // 2))


def _fail_persistence(client: redis.Redis) -> None:
    """A snapshot that cannot be written (``dir`` /proc), with ``save`` on: Redis answers MISCONF to writes."""
    client.config_set("save", "3600 1")
    client.config_set("dir", "/proc")
    client.bgsave()
    deadline = time.monotonic() + 30
    while client.info("persistence")["rdb_last_bgsave_status"] != "err":
        assert time.monotonic() < deadline, "the snapshot did not fail"
        time.sleep(0.02)


FAULTS = {
    "oom": (_fill_until_full, lambda c, d: c.config_set("maxmemory", "0")),
    "misconf": (_fail_persistence, lambda c, d: (c.config_set("dir", d), c.config_set("save", ""))),
    "readonly": (lambda c: c.replicaof("127.0.0.1", str(free_port())), lambda c, d: c.replicaof("NO", "ONE")),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_redis_that_refuses_writes_answers_writes_503_and_reads_200(tmp_path, caplog, fault):
    caplog.set_level(logging.INFO)
    server = RedisServer(tmp_path / "redis", extra_args=("--enable-protected-configs", "yes")).start()
    admin = redis.Redis.from_url(server.url)
    try:
        # the rate limits stay on (their buckets in Redis): the read bucket's write is what used to fail
        app = create_app(defaults(data=str(tmp_path / "node"), store=server.url, accept_weak_durability=True))
        with TestClient(app, raise_server_exceptions=False) as client:
            first = client.post("/v1/knowledge/events", content=publication("before the fault"), headers=HEADERS)
            assert first.status_code == 200, first.text
            event_id = first.json()["envelope"]["hash"]

            provoke, clear = FAULTS[fault]
            provoke(admin)
            reads = {
                "query": lambda: client.get("/v1/knowledge/query?limit=5"),
                "lookup": lambda: client.get(f"/v1/knowledge/events/{event_id}"),
                "batch": lambda: client.post("/v1/knowledge/batch", content=json.dumps({"hashes": [event_id]}),
                                             headers=HEADERS),
                "search": lambda: client.post("/v1/knowledge/search", headers=HEADERS,
                                              content=b'{"text": "statement", "mode": "lexical"}'),
                "explorer": lambda: client.get("/explorer/"),
                "metrics": lambda: client.get("/metrics"),
                "readyz": lambda: client.get("/readyz"),
            }
            for _ in range(3):  # again after the limiter fell back to its local bucket
                for name, call in reads.items():
                    response = call()
                    assert response.status_code == 200, (fault, name, response.status_code, response.text[:300])
            assert client.get("/v1/knowledge/query?limit=5").json()["checkpoint"] == 1
            writes = {
                "submit": lambda: client.post("/v1/knowledge/events", content=publication("during"), headers=HEADERS),
                "knowql": lambda: client.post("/query", content=KNOWQL, headers=HEADERS),
            }
            for name, call in writes.items():
                for _ in range(2):
                    response = call()
                    assert response.status_code == 503, (fault, name, response.status_code, response.text[:300])
                    assert int(response.headers["retry-after"]) >= 1
                    error = response.json()["error"]
                    assert error["code"] == "service_unavailable" and "refused the write" in error["message"]

            clear(admin, str(server.directory))
            again = client.post("/v1/knowledge/events", content=publication("after the fault"), headers=HEADERS)
            assert again.status_code == 200 and again.json()["seq"] == 2, again.text
    finally:
        admin.close()
        server.kill()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], [r.getMessage() for r in bad]
    # the outage is logged once per kind of caller, not once per request
    unavailable_lines = [r for r in caplog.records if "store unavailable on" in r.getMessage()]
    assert 1 <= len(unavailable_lines) <= 2, [r.getMessage() for r in unavailable_lines]


def _reply(message: str, cls: type[redis.exceptions.ResponseError] = redis.exceptions.ResponseError):
    return cls(message)


@pytest.mark.parametrize(("exc", "kind"), [
    (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'. script: ab, on @user_script:21."),
     REFUSING),
    (_reply("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), REFUSING),
    (_reply("Command # 1 (SET c 1) of pipeline caused error: MISCONF Redis is configured to save RDB snapshots"),
     REFUSING),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), REFUSING),
    (_reply("NOREPLICAS Not enough good replicas to write."), REFUSING),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), DOWN),
    (redis.exceptions.ConnectionError("Error 111 connecting"), DOWN),
    (redis.exceptions.TimeoutError("Timeout reading from socket"), DOWN),
    (_reply("BUSY Redis is busy running a script."), DOWN),
    (ConnectionResetError(), DOWN),
    (_reply("BUSYKEY Target key name already exists."), None),
    (_reply("ERR wrong number of arguments"), None),
    (_reply("WRONGTYPE Operation against a key holding the wrong kind of value"), None),
    (ValueError("a bug"), None),
])
def test_which_redis_errors_are_outages(exc, kind):
    assert outage_kind(exc) == kind
    assert is_outage(exc) == (kind is not None)


def test_unavailable_maps_refusals_and_leaves_bugs_alone():
    with pytest.raises(StoreUnavailable) as caught:
        with unavailable("the thing"):
            raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'. script: ab")
    assert "the thing refused the write: Redis is out of memory" in str(caught.value)
    assert "script:" not in str(caught.value)
    with pytest.raises(redis.exceptions.ResponseError):
        with unavailable("the thing"):
            raise redis.exceptions.ResponseError("ERR syntax error")
    assert outage_reason(_reply("MISCONF x")).startswith("Redis cannot persist")


def test_the_sync_lease_and_federation_state_on_a_full_redis(tmp_path) -> None:
    """The lease is "not now" (no exception), a state write is StoreUnavailable, a state read still answers."""
    from akrelay.backend import backend_for
    from akrelay.federation.redis_state import RedisFederationState
    from akrelay.federation.state import PeerState
    from akrelay.settings import defaults

    server = RedisServer(tmp_path / "redis").start()
    admin = redis.Redis.from_url(server.url)
    try:
        backend = backend_for(defaults(store=server.url, data=str(tmp_path)))
        leading = backend.leadership()
        assert leading.acquire()
        state = RedisFederationState(backend.client, token=leading.token, prefix=backend.prefix("sync"))
        state.put(PeerState("https://peer.example", checkpoint=5))
        other = backend_for(defaults(store=server.url, store_namespace="other", data=str(tmp_path))).leadership()
        _fill_until_full(admin)
        assert other.acquire() is False  # its SET is refused: not leading now, retried later
        with pytest.raises(StoreUnavailable, match="out of memory"):
            state.put(PeerState("https://peer.example", checkpoint=6))
        assert state.get("https://peer.example").checkpoint == 5
        admin.config_set("maxmemory", "0")
        assert other.acquire() is True
        other.close()
        leading.close()
    finally:
        admin.close()
        server.kill()


def test_a_knowql_turn_that_meets_an_outage_stops_without_a_traceback(caplog) -> None:
    """Its progress cannot be written (Redis full or down): one WARNING, the turn thread ends quietly,
    and the turn's failure is written once the store takes writes again (issue 24 items 7 and 8)."""
    from akrelay.knowql.runner import Turn, TurnRunner

    refused = StoreUnavailable("the KnowQL session store (Redis) refused the write: Redis is out of memory", 2)
    writes: list[str] = []
    full = True

    class FullStore:
        def append_events(self, query_id, events):
            writes.append("append")
            if full:
                raise refused

        def finish(self, *args, **kwargs):
            writes.append("finish")
            if full:
                raise refused
            return True

    runner = TurnRunner(FullStore(), search=lambda: None, runtime=lambda: None, records=None,
                        origin="https://relay.example")
    turn = Turn(query_id="q1", session_id="s1", doc=None, scope=[], policy="extractive", model=None,  # type: ignore[arg-type]
                history=(), system_prompt=None, guardrails=None, deadline=time.time() + 60, timeout=60)
    caplog.set_level(logging.INFO)
    try:
        runner.run(turn)  # returns: the worker thread goes on
        assert writes == ["append"] and len(runner.deferred) == 1  # the failure waits for the store
        bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        assert bad == [], [r.getMessage() for r in bad]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "out of memory" in warnings[0], warnings
        full = False
        assert runner.deferred.flush() and writes[-1] == "finish" and len(runner.deferred) == 0
    finally:
        runner.deferred.close()
