"""The token buckets shared through Redis: one budget per client across nodes, and an outage that fails open."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator

import redis
from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.store.memory import MemoryStore

from akrelay.backend import backend_for
from akrelay.http.ratelimit import KEY_PREFIX, RETRY_FIRST, RedisTokenBucket, limiter_client
from akrelay.settings import defaults
from akrelay.store.redis.client import connect
from redis_server import RedisServer

from relay_harness import NOW, ORIGIN, Clock, Harness, error_of


@contextlib.contextmanager
def node_app(url: str, **overrides) -> Iterator[Harness]:
    """The core app over a memory relay, its limits shared through ``url`` (one relay node)."""
    settings = defaults(store=url, **overrides)
    clock = Clock(NOW)
    relay = Relay(MemoryStore(), RelayConfig(origin=ORIGIN), clock=clock, cursor_secret=b"k" * 32)
    app = create_app(relay, settings, components=())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Harness(client, relay, clock, settings, app.state.node)


def wait_for(predicate, timeout: float = 60.0) -> bool:
    """Poll ``predicate`` until it holds, under a deadline generous for a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def _node(url: str, rate: float = 0.001, burst: int = 5, **kw) -> RedisTokenBucket:
    """A bucket with its own client, as one relay node (or worker) would have."""
    return RedisTokenBucket(limiter_client(url), "write", rate, burst, **kw)


def test_two_nodes_share_one_budget_per_client(redis_url) -> None:
    a, b = _node(redis_url), _node(redis_url)
    admitted = [bucket.take("10.0.0.1") for bucket in (a, b, a, b, a)]
    assert admitted == [0.0] * 5
    # The sixth request is refused on either node, with the wait of one token at the rate.
    for bucket in (a, b):
        wait = bucket.take("10.0.0.1")
        assert 990 < wait <= 1000
    # Another client, and another bucket name, have budgets of their own.
    assert a.take("10.0.0.2") == 0.0
    assert RedisTokenBucket(connect(redis_url), "read", 0.001, 1).take("10.0.0.1") == 0.0
    assert not a.degraded and not b.degraded


def test_refill_at_the_rate_and_keys_expire_when_full(redis_url) -> None:
    # One token a second: the two takes below share a bucket unless a second passes between them,
    # which a loaded machine does not do (at 20/s it took only 50 ms of stall to flake).
    a, b = _node(redis_url, rate=1.0, burst=1), _node(redis_url, rate=1.0, burst=1)
    assert a.take("c") == 0.0
    assert 0 < b.take("c") <= 1.0
    client = redis.Redis.from_url(redis_url)
    ttl = client.pttl(KEY_PREFIX + "write:c")
    assert 0 < ttl <= 1001  # gone once the bucket would be full again: a missing key is a full bucket
    assert wait_for(lambda: b.take("c") == 0.0)  # refilled (a refusal writes nothing, so asking is free)
    ttl = client.pttl(KEY_PREFIX + "write:c")
    assert 0 < ttl <= 1001
    assert wait_for(lambda: client.exists(KEY_PREFIX + "write:c") == 0)


def test_a_refusal_writes_nothing(redis_url) -> None:
    a = _node(redis_url, rate=0.001, burst=1)
    assert a.take("c") == 0.0
    client = redis.Redis.from_url(redis_url)
    before = client.hgetall(KEY_PREFIX + "write:c")
    assert a.take("c") > 0 and client.hgetall(KEY_PREFIX + "write:c") == before


def test_an_outage_falls_back_to_the_local_bucket_then_back_to_redis(tmp_path, caplog) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        now = [100.0]
        bucket = _node(server.url, rate=0.001, burst=2, clock=lambda: now[0])
        assert bucket.take("c") == 0.0 and bucket.take("c") == 0.0 and bucket.take("c") > 0
        server.kill()
        with caplog.at_level(logging.WARNING, logger="akrelay.http"):
            started = time.monotonic()
            # Redis is down: the process's own bucket (full) admits, quickly; no exception.
            assert bucket.take("c") == 0.0
            assert time.monotonic() - started < 2.5  # a refused connection: no retries, no store timeout (3 s)
            assert bucket.degraded
            assert bucket.take("c") == 0.0 and bucket.take("c") > 0  # the local burst of 2 is spent
        assert any("Redis unreachable" in r.message for r in caplog.records)
        server.start()
        now[0] += RETRY_FIRST + 0.1
        with caplog.at_level(logging.WARNING, logger="akrelay.http"):
            # The shared bucket again. Buckets are soft state, kept out of the AOF (an fsync per request
            # otherwise): the restarted Redis starts every bucket full, then the budget is shared again.
            assert bucket.take("c") == 0.0
        assert not bucket.degraded
        other = _node(server.url, rate=0.001, burst=2)
        assert other.take("c") == 0.0 and other.take("c") > 0 and bucket.take("c") > 0
        assert any("Redis is back" in r.message for r in caplog.records)
    finally:
        server.kill()


def test_back_off_doubles_while_redis_stays_away(tmp_path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    server.kill()
    now = [0.0]
    bucket = _node(server.url, rate=100.0, burst=100, clock=lambda: now[0])
    calls = []
    original = bucket._script

    def counting(*args, **kwargs):
        calls.append(now[0])
        return original(*args, **kwargs)

    bucket._script = counting
    for _ in range(40):
        assert bucket.take("c") == 0.0
        now[0] += 0.5
    # Tried at 0, then after 1, 2, 4, 8, 8 ... seconds: not on every request.
    assert calls == [0.0, 1.0, 3.0, 7.0, 15.0]


def test_two_apps_on_one_redis_share_the_write_budget(redis_url) -> None:
    limits = dict(write_rate=0.001, write_burst=2, read_rate=0.0)
    with node_app(redis_url, **limits) as node_a, node_app(redis_url, **limits) as node_b:
        # Each node has a store of its own here: only the budget is shared.
        assert node_a.submit_fixture("original").status_code == 200
        assert node_b.submit_fixture("original").status_code == 200
        for node in (node_b, node_a):
            refused = node.submit_fixture("original")
            assert error_of(refused) == (429, "rate_limited") and int(refused.headers["retry-after"]) >= 1
        assert node_a.relay.checkpoint() == 1 and node_b.relay.checkpoint() == 1


def test_an_app_keeps_answering_while_its_redis_is_down(tmp_path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        with node_app(server.url, write_rate=100.0, write_burst=100, read_rate=100.0) as h:
            assert h.query().status_code == 200
            server.kill()
            started = time.monotonic()
            assert h.submit_fixture("original").status_code == 200
            assert h.query().status_code == 200
            assert time.monotonic() - started < 2.0
    finally:
        server.kill()


def test_the_limits_close_their_client(redis_url) -> None:
    limits = backend_for(defaults(store=redis_url)).rate_limits()
    assert isinstance(limits["write"], RedisTokenBucket) and isinstance(limits["read"], RedisTokenBucket)
    assert limits["write"].take("c") == 0.0
    limits.close()
    limits.close()
    assert not isinstance(backend_for(defaults()).rate_limits()["write"], RedisTokenBucket)


def test_a_stalled_redis_costs_one_short_wait_then_the_local_bucket_decides(tmp_path) -> None:
    import os
    import signal

    server = RedisServer(tmp_path / "redis").start()
    try:
        now = [0.0]
        bucket = _node(server.url, rate=100.0, burst=100, clock=lambda: now[0])
        assert bucket.take("c") == 0.0
        calls = []
        script = bucket._script
        bucket._script = lambda *args, **kwargs: calls.append(1) or script(*args, **kwargs)
        os.kill(server.process.pid, signal.SIGSTOP)  # alive, accepting, never answering
        try:
            started = time.monotonic()
            assert bucket.take("c") == 0.0
            # REDIS_TIMEOUT (0.25 s), not the store's 3 s, and no hang; room for a loaded machine
            assert time.monotonic() - started < 2.5 and calls == [1]
            assert all(bucket.take("c") == 0.0 for _ in range(50))
            assert calls == [1]  # the back-off: Redis is not asked again yet (the injected clock stands still)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    finally:
        server.kill()


def test_requests_waiting_together_take_their_tokens_in_one_redis_call(redis_url) -> None:
    import asyncio

    a, b = _node(redis_url, rate=0.001, burst=30), _node(redis_url, rate=0.001, burst=30)
    calls = []
    original = a._script

    def counting(*args, **kwargs):
        calls.append(len(kwargs["keys"]))
        return original(*args, **kwargs)

    a._script = counting

    async def burst() -> list[float]:
        return await asyncio.gather(*(a.acquire("10.0.0.9") for _ in range(25)))

    try:
        waits = asyncio.run(burst())
        # Exact: each of the 25 took one token in Redis, in one call rather than 25 round trips.
        assert waits == [0.0] * 25 and calls == [25]
        # The budget is the deployment's: another node sees 5 tokens left.
        assert [b.take("10.0.0.9") for _ in range(6)][:5] == [0.0] * 5 and b.take("10.0.0.9") > 0
        assert asyncio.run(a.acquire("10.0.0.9")) > 0
    finally:
        a.close()


def test_a_slow_redis_does_not_stop_the_event_loop(tmp_path) -> None:
    import asyncio
    import os
    import signal

    server = RedisServer(tmp_path / "redis").start()
    bucket = _node(server.url, rate=100.0, burst=100)
    try:
        assert bucket.take("c") == 0.0
        os.kill(server.process.pid, signal.SIGSTOP)  # every reply waits for the limiter's timeout

        async def scenario() -> tuple[float, int]:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.create_task(ticker())
            wait = await bucket.acquire("c")
            task.cancel()
            return wait, ticks

        try:
            wait, ticks = asyncio.run(scenario())
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        # The local bucket decided after the timeout, and other coroutines ran meanwhile (a blocking
        # round trip on the loop would have left the ticker at 0).
        assert wait == 0.0 and bucket.degraded
        assert ticks >= 5
    finally:
        server.kill()
        bucket.close()


def test_tokens_are_soft_state_kept_out_of_the_aof(redis_url) -> None:
    """A bucket is not worth an fsync per request (``appendfsync always``): its writes skip the AOF."""
    client = redis.Redis.from_url(redis_url)
    bucket = _node(redis_url, rate=0.001, burst=10)
    before = client.info("persistence")["aof_current_size"]
    assert [bucket.take("10.0.0.7") for _ in range(3)] == [0.0] * 3
    assert client.info("persistence")["aof_current_size"] == before
    # ... and still shared and exact on the primary: 7 tokens left.
    assert 7.0 <= float(client.hget(KEY_PREFIX + "write:10.0.0.7", "t")) < 7.01
