"""Relay nodes over a shared Redis log: outages answer 503 (never 500 or a hang), readiness, cross-node wake-ups.

Each test that kills Redis runs its own ``redis-server`` (the session's one serves the other tests).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time

import pytest
from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.node import open_relay_for
from akrelay.protocol.signer import Signer, assess_event, publish_event
from akrelay.settings import defaults
from akrelay.store.redis.store import WeakDurability
from redis_server import RedisServer

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
HEADERS = {"content-type": "application/json"}
SIGNER = Signer.from_seed(b"\x05" * 32)
_nonce = itertools.count(1)


def publication(title: str = "redis shared log") -> bytes:
    payload = {"license": LICENSE, "kind": "observation", "language": "en", "title": title, "statement": f"{title} statement",
               "context": {"scope": "tests", "conditions": [], "limitations": []}, "basis": "a test"}
    event = publish_event(SIGNER.agent_id, int(time.time() * 1000), next(_nonce), payload)
    return json.dumps(SIGNER.sign(event)).encode()


def assessment(target: str) -> bytes:
    payload = {"license": LICENSE, "target": target, "verdict": "supports", "summary": "seen it",
               "context": {"scope": "tests", "conditions": [], "limitations": []}, "basis": "a test"}
    event = assess_event(SIGNER.agent_id, int(time.time() * 1000), next(_nonce), payload)
    return json.dumps(SIGNER.sign(event)).encode()


@pytest.fixture
def private_redis(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


def _settings(tmp_path, url, name="node", **extra):
    return defaults(data=str(tmp_path / name), store=url, write_rate=0.0, read_rate=0.0, **extra)


def _timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def _wait_status(client, path, status, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get(path)
        if response.status_code == status:
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not answer {status} within {timeout} s")


def test_a_redis_outage_is_503_with_retry_after_and_the_node_recovers(tmp_path, private_redis, caplog):
    caplog.set_level(logging.INFO)
    app = create_app(_settings(tmp_path, private_redis.url), components=())
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/readyz").status_code == 200
        first = client.post("/v1/knowledge/events", content=publication(), headers=HEADERS)
        assert first.status_code == 200, first.text
        event_id = first.json()["envelope"]["hash"]

        private_redis.kill()
        killed = time.monotonic()
        noticed = _wait_status(client, "/readyz", 503, 15)
        assert noticed - killed < 15  # about 2 s (a probe per second, each answered at once when refused)
        assert client.get("/healthz").status_code == 200  # the process is up
        requests = {
            "submit": lambda: client.post("/v1/knowledge/events", content=publication("while down"), headers=HEADERS),
            "assess": lambda: client.post("/v1/knowledge/events", content=assessment(event_id), headers=HEADERS),
            "resubmit": lambda: client.post("/v1/knowledge/events", content=b"x" + b"", headers=HEADERS),
            "lookup": lambda: client.get(f"/v1/knowledge/events/{event_id}"),
            "query": lambda: client.get("/v1/knowledge/query?limit=5"),
            "batch": lambda: client.post("/v1/knowledge/batch", content=json.dumps({"hashes": [event_id]}), headers=HEADERS),
            "readyz": lambda: client.get("/readyz"),
        }
        for name, call in requests.items():
            response, took = _timed(call)
            assert took < 10, (name, took)
            if name == "resubmit":  # not JSON at all: refused before the store is needed
                assert response.status_code == 400
                continue
            assert response.status_code == 503, (name, response.status_code, response.text)
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["code"] == "service_unavailable"
        assert client.get("/.well-known/agent-knowledge").status_code == 200  # no store needed

        private_redis.start()
        restarted = time.monotonic()
        recovered = _wait_status(client, "/readyz", 200, 15)
        assert recovered - restarted < 15
        again = client.post("/v1/knowledge/events", content=publication("after the outage"), headers=HEADERS)
        assert again.status_code == 200 and again.json()["seq"] == 2
        assert client.get(f"/v1/knowledge/events/{event_id}").json()["seq"] == 1
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], [r.getMessage() for r in bad]


def test_health_endpoints_on_the_embedded_store(tmp_path):
    app = create_app(defaults(data=str(tmp_path / "data")), components=())
    with TestClient(app) as client:
        for path in ("/healthz", "/readyz"):
            response = client.get(path)
            assert response.status_code == 200 and response.json() == {"status": "ok"}
            head = client.head(path)
            assert head.status_code == 200 and head.content == b""


def test_readyz_is_503_until_the_node_started(tmp_path):
    app = create_app(defaults(data=str(tmp_path / "data")), components=())
    client = TestClient(app)  # no lifespan: the node was never started
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["error"]["code"] == "service_unavailable"
    assert client.get("/healthz").status_code == 200
    app.state.node.stop()


def test_a_node_refuses_a_redis_with_weak_live_durability(tmp_path, private_redis):
    import redis

    client = redis.Redis.from_url(private_redis.url)
    client.config_set("appendfsync", "everysec")
    client.close()
    with pytest.raises(WeakDurability, match="appendfsync"):
        open_relay_for(_settings(tmp_path, private_redis.url))
    relay = open_relay_for(_settings(tmp_path, private_redis.url, accept_weak_durability=True))
    relay.close()


def test_two_nodes_share_one_log_cursors_and_wake_ups(tmp_path, redis_url):
    a = open_relay_for(_settings(tmp_path, redis_url, "a"))
    b = open_relay_for(_settings(tmp_path, redis_url, "b"))
    woken = threading.Event()
    try:
        assert a.data_dir == tmp_path / "a" and not list((tmp_path / "a").glob("*.sqlite3"))
        b.on_commit(woken.set)
        b.start()
        assert woken.wait(60)  # subscribed: the watcher wakes once when its subscription is in place
        woken.clear()
        records = [a.submit(publication(f"shared {i}"))[0] for i in range(3)]
        assert woken.wait(60)  # a commit on A wakes B's followers
        assert [r.seq for r in records] == [1, 2, 3]
        # read-your-writes across nodes: B accepts an assessment of what A just accepted
        assessed, created = b.submit(assessment(records[2].id))
        assert created and assessed.seq == 4
        # a resubmission to B answers A's record, byte for byte
        again, created = b.submit(records[0].to_json()[records[0].to_json().index(b'"envelope":') + 11:-len(b',"seq":1}')])
        assert not created and again.to_json() == records[0].to_json()
        # a cursor issued by A is accepted by B
        page = a.query([("limit", "1")])
        assert page.next_cursor is not None
        following = b.query([("limit", "1"), ("cursor", page.next_cursor)])
        assert [r.seq for r in following.records] == [2]
    finally:
        a.close()
        b.close()
    assert not [t for t in threading.enumerate() if t.name == "akrelay-redis-watch"]


def test_a_capsule_accepted_on_one_node_is_searchable_on_the_other(tmp_path, redis_url):
    """Polled under a generous deadline: the lag itself (goal 1 s) is a figure of tests/durability's
    cluster run, not a wall-clock bound that a loaded machine breaks here."""
    apps = [create_app(_settings(tmp_path, redis_url, name), components=("search",)) for name in ("a", "b")]
    with TestClient(apps[0]) as node_a, TestClient(apps[1]) as node_b:
        search = {"text": "zyzzyvaword", "mode": "lexical"}
        accepted = node_a.post("/v1/knowledge/events", content=publication("zyzzyvaword capsule"), headers=HEADERS)
        assert accepted.status_code == 200
        started = time.monotonic()
        found = []
        while time.monotonic() - started < 60 and not found:
            response = node_b.post("/v1/knowledge/search", content=json.dumps(search), headers=HEADERS)
            assert response.status_code == 200, response.text
            found = response.json()["result"]
            time.sleep(0.02)
        assert found, "not searchable on node B within 60 s"


@pytest.mark.slow
def test_akrelay_serve_with_a_redis_store(tmp_path, redis_url):
    """The real command: two workers over the shared log; --data holds no log; weak durability refused at start."""
    import subprocess
    import sys

    import httpx
    from relay_harness import start_relay

    served = start_relay(tmp_path / "node", workers=2, extra=["--store", redis_url])
    try:
        with httpx.Client(verify=served.ssl_context(), timeout=10) as client:
            # discovery answers first; /readyz once the worker's KIP runtime is open too
            assert _wait_status(client, served.origin + "/readyz", 200, 60)
            accepted = client.post(served.origin + "/v1/knowledge/events", content=publication("served"), headers=HEADERS)
            assert accepted.status_code == 200 and accepted.json()["seq"] == 1
            page = client.get(served.origin + "/v1/knowledge/query").json()
            assert [r["seq"] for r in page["result"]] == [1] and page["checkpoint"] == 1
        assert not list((tmp_path / "node").glob("relay.sqlite3*"))
    finally:
        served.stop()

    import redis

    client = redis.Redis.from_url(redis_url)
    client.config_set("appendfsync", "everysec")
    try:
        result = subprocess.run([sys.executable, "-m", "akrelay", "serve", "--data", str(tmp_path / "weak"),
                                 "--store", redis_url, "--port", "1"], capture_output=True, text=True, timeout=60)
    finally:
        client.config_set("appendfsync", "always")
        client.close()
    assert result.returncode == 2
    assert "appendfsync is 'everysec'" in result.stderr and "Traceback" not in result.stderr


def test_concurrent_submissions_commit_in_several_groups_at_once(tmp_path, redis_url):
    """The ingest batcher keeps several commit groups in flight on Redis: every seq once, duplicates answered."""
    import asyncio

    from litestar.testing import AsyncTestClient

    bodies = [publication(f"concurrent {i}") for i in range(60)]

    async def main():
        app = create_app(_settings(tmp_path, redis_url), components=())
        async with AsyncTestClient(app) as client:
            async def submit(body):
                return await client.post("/v1/knowledge/events", content=body, headers=HEADERS)

            answers = await asyncio.gather(*(submit(b) for b in bodies + bodies[:10]))
        return answers

    answers = asyncio.run(main())
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:3]
    seq_of = {}
    for answer in answers:
        record = answer.json()
        seq_of.setdefault(record["envelope"]["hash"], set()).add(record["seq"])
    assert all(len(seqs) == 1 for seqs in seq_of.values())
    assert sorted(s for seqs in seq_of.values() for s in seqs) == list(range(1, 61))


def test_submissions_are_verified_on_the_event_loop_and_only_store_lookups_hop_to_a_thread(tmp_path, redis_url,
                                                                                           monkeypatch):
    """The CPU-bound checks gain nothing on a thread (one GIL) and a hop per submission costs CPU; only a lookup
    the envelope needs (an assessment's target) may wait for Redis, so only that leaves the loop."""
    import asyncio

    from litestar.testing import AsyncTestClient

    import akrelay.relay.core as relay_module
    from akrelay.store.redis.store import RedisStore

    verified: list[bool] = []  # on an event loop's thread?
    looked_up: list[bool] = []
    verify, get_many = relay_module.verify_envelope, RedisStore.get_many

    def on_loop():
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    def verify_here(*args, **kwargs):
        verified.append(on_loop())
        return verify(*args, **kwargs)

    def get_many_here(self, ids):
        looked_up.append(on_loop())
        return get_many(self, ids)

    monkeypatch.setattr(relay_module, "verify_envelope", verify_here)
    monkeypatch.setattr(RedisStore, "get_many", get_many_here)

    async def main():
        app = create_app(_settings(tmp_path, redis_url), components=())
        async with AsyncTestClient(app) as client:
            first = await client.post("/v1/knowledge/events", content=publication("on the loop"), headers=HEADERS)
            published = list(verified)
            assert looked_up == []  # a new publication without targets needs no lookup at all
            second = await client.post("/v1/knowledge/events", content=assessment(first.json()["envelope"]["hash"]),
                                       headers=HEADERS)
            return first, second, published

    first, second, published = asyncio.run(main())
    assert first.status_code == 200 and second.status_code == 200, second.text
    assert published == [True] and verified == [True, True]
    assert looked_up and not any(looked_up)  # the target's lookup went to a thread


def test_a_stalled_redis_is_503_within_seconds_for_every_waiting_request(tmp_path, private_redis):
    """SIGSTOP: connections open but nothing answers (like a host that vanished). Requests must not queue behind
    each other's timeouts, and the event loop must keep answering /healthz meanwhile."""
    import asyncio
    import os
    import signal

    from litestar.testing import AsyncTestClient

    async def main():
        app = create_app(_settings(tmp_path, private_redis.url), components=())
        async with AsyncTestClient(app) as client:
            first = await client.post("/v1/knowledge/events", content=publication(), headers=HEADERS)
            event_id = first.json()["envelope"]["hash"]
            os.kill(private_redis.process.pid, signal.SIGSTOP)
            try:
                async def timed(method, url, **kw):
                    started = time.monotonic()
                    response = await client.request(method, url, **kw)
                    return response, time.monotonic() - started

                calls = []
                for i in range(12):
                    calls.append(timed("POST", "/v1/knowledge/events", content=publication(f"stalled {i}"), headers=HEADERS))
                    calls.append(timed("POST", "/v1/knowledge/events", content=assessment(event_id), headers=HEADERS))
                    calls.append(timed("GET", f"/v1/knowledge/events/{event_id}"))
                    calls.append(timed("GET", "/v1/knowledge/query?limit=3"))
                stalled_at = time.monotonic()
                gathered = asyncio.gather(*calls)
                await asyncio.sleep(0.5)
                health, health_took = await timed("GET", "/healthz")
                answers = await gathered
                answered_in = time.monotonic() - stalled_at
            finally:
                os.kill(private_redis.process.pid, signal.SIGCONT)
            recovered = False
            for _ in range(150):
                if (await client.get("/readyz")).status_code == 200:
                    recovered = True
                    break
                await asyncio.sleep(0.1)
            after = await client.post("/v1/knowledge/events", content=publication("after the stall"), headers=HEADERS)
        return health, health_took, answers, recovered, after, answered_in

    health, health_took, answers, recovered, after, answered_in = asyncio.run(main())
    assert answered_in < 10  # all 48 were sent at once: none waited for the others' timeouts
    assert health.status_code == 200 and health_took < 2.5  # not behind a store timeout (3 s); room for load
    assert {r.status_code for r, _ in answers} <= {200, 503}  # a 200 only if Redis answered before the stop
    assert sum(r.status_code == 503 for r, _ in answers) >= len(answers) - 2
    assert max(took for _, took in answers) < 10
    assert all(int(r.headers["retry-after"]) >= 1 for r, _ in answers if r.status_code == 503)
    assert recovered and after.status_code == 200


def test_every_component_runs_over_a_redis_log(tmp_path, redis_url):
    """Search, KIP, KnowQL and the web pages open their derived state in --data and read the shared log."""
    app = create_app(_settings(tmp_path, redis_url, "full"), components=None)
    with TestClient(app, raise_server_exceptions=False) as client:
        accepted = client.post("/v1/knowledge/events", content=publication("every component"), headers=HEADERS)
        assert accepted.status_code == 200
        kip = {"kip": "2.0", "operations": [{"command": "DESCRIBE SNAPSHOT"}]}
        assert client.post("/v1/kip", content=json.dumps(kip), headers=HEADERS).status_code == 200
        ask = {"ask": "what was published?", "scope": ["knowledge"], "retrieval_only": True}
        assert client.post("/query", content=json.dumps(ask), headers=HEADERS).status_code == 200
        assert client.post("/v1/knowledge/search", content=json.dumps({"text": "component", "mode": "lexical"}),
                           headers=HEADERS).status_code == 200
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and "akrelay_checkpoint 1.0" in metrics.text
        assert client.get("/explorer/").status_code == 200
    data = tmp_path / "full"
    assert (data / "search").exists() and (data / "kip-nexus.sqlite3").exists()
    assert not (data / "relay.sqlite3").exists()


def test_a_node_over_a_relay_it_does_not_own_stops_hearing_commits_when_it_stops(tmp_path, redis_url):
    """The node started the relay's commit watcher, so its stop ends it, though the caller keeps the relay open."""
    from akrelay.node import RelayNode

    relay = open_relay_for(_settings(tmp_path, redis_url))
    try:
        node = RelayNode(relay, _settings(tmp_path, redis_url), components=())
        relay.on_commit(lambda: None)  # a follower to wake: the watcher runs only for one
        node.start()
        assert [t for t in threading.enumerate() if t.name == "akrelay-redis-watch"]
        node.stop()
        assert not [t for t in threading.enumerate() if t.name == "akrelay-redis-watch" and t.is_alive()]
        assert relay.store.checkpoint() == 0  # still open: the caller closes it
    finally:
        relay.close()


def test_the_commit_watcher_runs_only_while_a_listener_wants_wake_ups(tmp_path, redis_url):
    """Every commit of the deployment wakes every subscriber: a process with nothing to wake does not subscribe."""
    relay = open_relay_for(_settings(tmp_path, redis_url))
    try:
        relay.start()
        assert relay.store._watchers == []
        woken = threading.Event()
        remove = relay.on_commit(woken.set)
        assert len(relay.store._watchers) == 1
        assert woken.wait(5)  # subscribed: the first wake-up comes on subscribing
        remove()
        assert relay.store._watchers == []
        relay.on_commit(lambda: None)
        relay.stop()
        assert relay.store._watchers == []
    finally:
        relay.close()


def test_workers_whose_followers_run_elsewhere_do_not_subscribe_to_commits(tmp_path, redis_url):
    """``akrelay serve``'s workers (``follow=False``) only read the index and the nexus that the followers'
    process keeps; that process subscribes, the workers do not (nor does a --core-only node)."""
    from akrelay.node import RelayNode

    settings = _settings(tmp_path, redis_url)
    with RelayNode.open(settings) as follower:  # what the followers' process is: it listens
        follower.kip.gateway.runtime()
        assert len(follower.relay.store._watchers) == 1
        with RelayNode.open(settings, follow=False) as worker:
            worker.search.engine  # noqa: B018 - opened: a listener would be registered by now
            worker.kip.gateway.runtime()
            assert worker.relay.store._watchers == []
    with RelayNode.open(_settings(tmp_path, redis_url, core_only=True)) as core:
        assert core.relay.store._watchers == []
