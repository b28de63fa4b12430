"""Builders for federation tests: signed events, local relays, respx-mocked peers.

A :class:`FakePeer` is a real :class:`Relay` on a memory store (so its records
are genuinely accepted, with its own ``seq``) served over respx. Its query and
batch handlers are written here, with an explicit cursor format, so that each
test can make one aspect misbehave while the rest stays conforming.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import httpx
import pytest
import respx

from akrelay.federation.peers import Peer
from akrelay.federation.state import FederationState
from akrelay.federation.sync import SyncEngine, SyncOptions
from akrelay.federation.transport import PeerTransport
from akrelay.protocol.signer import Signer, assess_event, publish_event, retract_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.store.memory import MemoryStore
from backends import params

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
PUBLIC_IP = "93.184.216.34"
LOCAL = "https://local.example"


def public_resolver(host: str, port: int) -> list[str]:
    return [PUBLIC_IP]


def context(scope: str = "A federation test fixture.") -> dict[str, Any]:
    return {"scope": scope, "conditions": [], "limitations": []}


class Author:
    """One signing agent with its own increasing nonces."""

    def __init__(self, name: str) -> None:
        self.signer = Signer.from_seed(name.encode().ljust(32, b"\0")[:32])
        self.nonce = 0
        self.created = int(time.time() * 1000) - 3_600_000

    @property
    def did(self) -> str:
        return self.signer.agent_id

    def _sign(self, build: Callable[..., dict], payload: dict[str, Any], created_at: int | None = None) -> dict:
        self.nonce += 1
        self.created += 1000
        return self.signer.sign(build(self.did, created_at or self.created, self.nonce, payload))

    def publish(self, title: str = "A result", *, kind: str = "observation", relations: list | None = None,
                created_at: int | None = None) -> dict:
        payload: dict[str, Any] = {
            "license": LICENSE, "kind": kind, "title": title, "statement": f"Statement of {title}.",
            "language": "en", "context": context(), "basis": "Measured in a test.",
        }
        if relations:
            payload["relations"] = relations
        return self._sign(publish_event, payload, created_at)

    def supersede(self, target: dict, title: str = "A correction") -> dict:
        return self.publish(title, relations=[{"relation": "supersedes", "target": target["hash"]}])

    def assess(self, target: dict, verdict: str = "supports") -> dict:
        return self._sign(assess_event, {
            "license": LICENSE, "target": target["hash"], "verdict": verdict,
            "summary": "Checked it.", "context": context(), "basis": "Read the statement.",
        })

    def retract(self, target: dict) -> dict:
        return self._sign(retract_event, {"license": LICENSE, "target": target["hash"], "reason": "Withdrawn."})


def raw(envelope: dict) -> bytes:
    return json.dumps(envelope).encode()


def make_relay(origin: str = LOCAL, clock: Callable[[], int] | None = None) -> Relay:
    kwargs = {"clock": clock} if clock else {}
    return Relay(MemoryStore(), RelayConfig(origin=origin), cursor_secret=b"s" * 32, **kwargs)


def local_ids(relay: Relay) -> list[str]:
    return [r.id for r in relay.store.iter_records(0, 1_000_000)]


class PeerData:
    """A conforming peer's answers, from a real relay on a memory store, as (status, body) pairs.

    The cursor format is explicit (``checkpoint.as_of.last_seq``) so that tests can
    make one aspect misbehave while the rest stays conforming; :class:`FakePeer`
    serves it over respx and ``hostile.HostilePeer`` over a real TLS socket.
    """

    def __init__(self, origin: str, *, query_path: str = "/v1/knowledge/query",
                 batch_path: str = "/v1/knowledge/batch") -> None:
        self.origin = origin
        self.relay = make_relay(origin)
        self.query_path = query_path
        self.batch_path = batch_path
        self.discovery_doc: dict[str, Any] = {
            "protocol": "agent-knowledge/1.0", "service": origin,
            "endpoints": {"events": origin + "/v1/knowledge/events", "query": origin + query_path,
                          "batch": origin + batch_path},
        }

    def add(self, *envelopes: dict) -> None:
        for env in envelopes:
            self.relay.submit(raw(env))

    def seq_of(self, envelope: dict) -> int:
        return self.relay.store.get(envelope["hash"]).seq

    def query(self, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        limit = int(params.get("limit", "100"))
        after = int(params.get("after_seq", "0"))
        if "cursor" in params:
            checkpoint, as_of, last = (int(x) for x in params["cursor"].split("."))
        else:
            checkpoint, as_of, last = self.relay.store.checkpoint(), 1_800_000_000_000, after
            if after > checkpoint:
                return 400, {"error": {"code": "invalid_request", "message": "after_seq"}}
        records = [r for r in self.relay.store.iter_records(last, 1_000_000)
                   if r.seq <= checkpoint and not r.withheld][:limit + 1]
        body: dict[str, Any] = {"result": [r.to_dict() for r in records[:limit]], "service": self.origin,
                                "checkpoint": checkpoint, "as_of": as_of}
        if len(records) > limit:
            body["next_cursor"] = f"{checkpoint}.{as_of}.{records[limit - 1].seq}"
        return 200, body

    def batch(self, hashes: list[str]) -> tuple[int, dict[str, Any]]:
        found = {h: r for h, r in self.relay.store.get_many(hashes).items() if not r.withheld}
        return 200, {"result": [found[h].to_dict() for h in hashes if h in found],
                     "missing": [h for h in hashes if h not in found], "service": self.origin,
                     "checkpoint": self.relay.store.checkpoint(), "as_of": 1_800_000_000_000}


class FakePeer(PeerData):
    """A conforming peer over respx; override ``page_hook``/``batch_hook``/``discovery_doc`` to misbehave."""

    def __init__(self, router: respx.MockRouter, origin: str = "https://peer-a.example", *,
                 query_path: str = "/v1/knowledge/query", batch_path: str = "/v1/knowledge/batch") -> None:
        super().__init__(origin, query_path=query_path, batch_path=batch_path)
        self.query_calls: list[dict[str, str]] = []
        self.batch_calls: list[list[str]] = []
        self.page_hook: Callable[[dict, int], Any] | None = None
        self.batch_hook: Callable[[dict], Any] | None = None
        self.discovery_route = router.get(origin + "/.well-known/agent-knowledge").mock(side_effect=self._discovery)
        self.query_route = router.get(origin + query_path).mock(side_effect=self._query)
        self.batch_route = router.post(origin + batch_path).mock(side_effect=self._batch)

    def _discovery(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=self.discovery_doc)

    def _query(self, request: httpx.Request) -> Any:
        params = dict(request.url.params)
        self.query_calls.append(params)
        status, body = self.query(params)
        if status == 200 and self.page_hook is not None:
            hooked = self.page_hook(body, len(self.query_calls))
            if hooked is not None:
                return hooked
        return httpx.Response(status, json=body)

    def _batch(self, request: httpx.Request) -> Any:
        hashes = json.loads(request.content)["hashes"]
        self.batch_calls.append(hashes)
        _, body = self.batch(hashes)
        if self.batch_hook is not None:
            hooked = self.batch_hook(body)
            if hooked is not None:
                return hooked
        return httpx.Response(200, json=body)


class Clock:
    def __init__(self, now: int | None = None) -> None:
        self.now = now if now is not None else int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


def make_engine(relay: Relay, peers: list[Peer], state: FederationState | None = None, *,
                clock: Clock | None = None, resolver=public_resolver, **options: Any) -> SyncEngine:
    return SyncEngine(
        relay, state or FederationState(), peers, SyncOptions(own_origin=LOCAL, **options),
        transport_factory=lambda p: PeerTransport(p, resolver=resolver),
        clock_ms=clock or Clock(),
    )


@pytest.fixture
def router():
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as mock:
        yield mock


@pytest.fixture
def author() -> Author:
    return Author("alice")


@pytest.fixture(params=params(without=("memory",)))  # the SQLite state's ":memory:" is the fresh one
def new_state(request, tmp_path):
    """Opens federation states of one backend, so state tests run on both.

    ``new_state()`` is a fresh, empty state (SQLite in memory; Redis under a prefix of its own);
    ``new_state("name")`` opens the same state again after a close (a file; the same Redis keys).
    A Redis state writes under a sync lease it holds (its fencing token).
    """
    opened: list[Any] = []
    if request.param == "sqlite":
        def make(name: str | None = None, **kw: Any) -> Any:
            state = FederationState(tmp_path / f"{name}.sqlite3" if name else ":memory:", **kw)
            opened.append(state)
            return state
    else:
        from akrelay.federation.redis_state import KEY_PREFIX, RedisFederationState
        from akrelay.leader import RedisLease
        from akrelay.store.redis.client import connect

        client = connect(request.getfixturevalue("redis_url"))
        leases: dict[str, RedisLease] = {}
        fresh = iter(range(1_000_000))

        def make(name: str | None = None, **kw: Any) -> Any:
            prefix = f"{KEY_PREFIX}{name or f'fresh{next(fresh)}'}:"
            if prefix not in leases:
                leases[prefix] = RedisLease(client, prefix, ttl=600)
                assert leases[prefix].acquire()
            state = RedisFederationState(client, token=leases[prefix].token, prefix=prefix, **kw)
            opened.append(state)
            return state
    yield make
    for state in opened:
        state.close()
    if request.param == "redis":
        client.close()
