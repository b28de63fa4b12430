"""KnowQL has its own limits: a rate per client, turns in flight per client, a bounded queue (issue 24, 3-4)."""

from __future__ import annotations

import threading

import pytest

from akrelay.backend import backend_for
from akrelay.http.ratelimit import RedisTokenBucket
from akrelay.knowql.models import EXTRA_COMPOSERS, ModelEntry
from akrelay.knowql.engine import TURN_THREADS
from akrelay.settings import defaults

from .conftest import SlowComposer
from .kq_harness import knowql_app


@pytest.fixture
def slow():
    """Turns that hold their thread until the test opens the gate (at most 120 s: a loaded machine)."""
    composer = SlowComposer(limit=120.0)
    EXTRA_COMPOSERS["test/slow"] = lambda settings: ModelEntry("test/slow", "Slow (tests)", "tests", composer)
    try:
        yield composer
    finally:
        composer.gate.set()
        EXTRA_COMPOSERS.pop("test/slow", None)

ASK = {"ask": "cache restart", "scope": ["knowledge"]}


def _refused(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert int(response.headers["retry-after"]) >= 1


def test_knowql_turns_have_their_own_rate_per_client() -> None:
    with knowql_app(knowql_rate=0.001, knowql_burst=2, read_rate=1000.0, read_burst=1000) as kq:
        assert kq.ask(ASK).status_code == 200
        assert kq.ask(ASK).status_code == 200
        _refused(kq.ask(ASK), 429, "rate_limited")
        assert kq.client.get("/models").status_code == 200  # reads are not charged to the turn bucket


def test_the_knowql_bucket_is_shared_in_redis_with_a_redis_store() -> None:
    limits = backend_for(defaults(store="redis://127.0.0.1:1/0", knowql_rate=3.0, knowql_burst=7)).rate_limits()
    try:
        bucket = limits["knowql"]
        assert isinstance(bucket, RedisTokenBucket) and (bucket.rate, bucket.burst) == (3.0, 7)
    finally:
        limits.close()


def test_a_client_has_a_cap_on_turns_in_flight(slow) -> None:
    with knowql_app(knowql_inflight=2) as kq:
        held = [kq.ask({**ASK, "model": "test/slow", "background": True}) for _ in range(2)]
        assert [r.status_code for r in held] == [202, 202]
        _refused(kq.ask({**ASK, "background": True}), 429, "rate_limited")
        slow.gate.set()
        for r in held:
            _wait_terminal(kq, r.json()["id"])
        assert kq.ask(ASK).status_code == 200  # the slots were given back


def test_the_turn_queue_is_bounded(slow) -> None:
    with knowql_app(knowql_inflight=100, knowql_queue=2) as kq:
        held = [kq.ask({**ASK, "model": "test/slow", "background": True}) for _ in range(TURN_THREADS + 2)]
        assert {r.status_code for r in held} == {202}
        _refused(kq.ask(ASK), 503, "service_unavailable")
        slow.gate.set()
        for r in held:
            _wait_terminal(kq, r.json()["id"])
        assert kq.ask(ASK).status_code == 200


def test_a_client_has_a_cap_on_open_event_streams(slow) -> None:
    with knowql_app(knowql_tails=2) as kq:
        turn = kq.ask({**ASK, "model": "test/slow", "background": True}).json()
        path = f"/queries/{turn['id']}/events"
        results: list = []

        def stream() -> None:
            results.append(kq.client.get(path))

        streams = [threading.Thread(target=stream) for _ in range(2)]
        for t in streams:
            t.start()
        service = kq.node.knowql.engine
        _until(lambda: sum(service.admission._tails.values()) == 2)
        _refused(kq.client.get(path), 429, "rate_limited")
        slow.gate.set()
        for t in streams:
            t.join(30)
        assert [r.status_code for r in results] == [200, 200]
        _until(lambda: not service.admission._tails)
        assert kq.client.get(path).status_code == 200  # the slots were given back


def _until(condition, seconds: float = 30.0) -> None:
    done = threading.Event()
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        done.wait(0.02)
    raise AssertionError("condition not reached")


def _wait_terminal(kq, query_id: str) -> None:
    _until(lambda: kq.client.get(f"/queries/{query_id}").json()["status"] != "in_progress")


def test_a_stream_that_never_starts_gives_its_slot_back() -> None:
    from akrelay.http.knowql import _counted_tail, _TailSlot
    from akrelay.knowql.admission import Admission

    class Service:
        admission = Admission(per_client=1, threads=1, queue=0, tails=1)

    async def frames():
        yield b": ping\n\n"

    service = Service()
    service.admission.enter_tail("client")
    stream = _counted_tail(_TailSlot(service, "client"), frames())  # the client left before the first byte
    del stream
    service.admission.enter_tail("client")  # the slot is free again (no 429)


def test_two_nodes_on_one_redis_share_a_clients_turn_budget(redis_url) -> None:
    settings = {"store": redis_url, "knowql_rate": 0.001, "knowql_burst": 2}
    with knowql_app(**settings) as first, knowql_app(**settings) as second:
        assert first.ask(ASK).status_code == 200
        assert second.ask(ASK).status_code == 200
        _refused(first.ask(ASK), 429, "rate_limited")  # the budget was spent on both nodes together
        _refused(second.ask(ASK), 429, "rate_limited")
