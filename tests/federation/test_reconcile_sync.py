"""Sync's use of set reconciliation (issue 26): bootstrap, healing holes, fallback, a 3-relay mesh.

Peers are :class:`FakePeer` relays over respx that also serve ``POST /v1/knowledge/reconcile``
from their own store's index, so both sides run the real code. Batch fetches are counted:
what reconciliation fetches must be exactly the differences.
"""

from __future__ import annotations

import httpx
import respx

from akrelay.federation.peers import Peer
from akrelay.federation.reconcile import (NOT_ADVERTISED, RECONCILE_PATH, Capabilities, capabilities, discovery,
                                         parse_request, respond)
from akrelay.protocol.reconcile import MAX_MESSAGE
from akrelay.federation.runner import reconcile_now
from akrelay.federation.state import FederationState

from .conftest import LOCAL, Author, Clock, FakePeer, make_engine, make_relay, raw


class ReconcilingPeer(FakePeer):
    """A conforming peer that also answers reconciliation messages (and counts them)."""

    def __init__(self, router: respx.MockRouter, origin: str = "https://peer-a.example") -> None:
        super().__init__(router, origin)
        self.discovery_doc |= discovery(origin)
        self.reconcile_calls = 0
        self.reconcile_hook = None
        #: the answer size each message asked for (``?frame_limit=``, default 60,000)
        self.frame_limits: list[int] = []
        router.post(origin + RECONCILE_PATH).mock(side_effect=self._reconcile)

    def _reconcile(self, request: httpx.Request) -> httpx.Response:
        self.reconcile_calls += 1
        if self.reconcile_hook is not None:
            hooked = self.reconcile_hook(request)
            if hooked is not None:
                return hooked
        window, frame_limit = parse_request(request.url.params.multi_items())
        self.frame_limits.append(frame_limit)
        return httpx.Response(200, content=respond(self.relay.store.recon, request.content, since=window.since,
                                                   until=window.until, frame_limit=frame_limit),
                              headers={"content-type": "application/octet-stream"})

    def fetched(self) -> list[str]:
        return [h for call in self.batch_calls for h in call]


def peer_of(p: FakePeer) -> Peer:
    return Peer(origin=p.origin)


def events(author: Author, n: int) -> list[dict]:
    return [author.publish(f"Result {i}") for i in range(n)]


def test_first_contact_bootstraps_by_reconciling_instead_of_re_pulling(router, author) -> None:
    peer = ReconcilingPeer(router)
    evs = events(author, 30)
    peer.add(*evs)
    local = make_relay()
    for env in evs[:-2]:  # we hold all but two already (from another peer, say)
        local.submit(raw(env))
    engine = make_engine(local, [peer_of(peer)])
    result = engine.sync_peer(engine.peers[0])
    assert result.ok, result.error
    assert sorted(peer.fetched()) == sorted(e["hash"] for e in evs[-2:])
    pulled = sum(1 for call in peer.query_calls if call.get("limit") != "1")
    st = engine.state.get(peer.origin)
    assert st.checkpoint == peer.relay.store.checkpoint()
    assert "bootstrapped" in st.reconcile_note
    assert result.duplicates == 0 and result.accepted == 2
    assert pulled == 1  # the one enumeration page after the bootstrap checkpoint, empty
    assert {r.id for r in local.store.iter_records(0, 100)} == {e["hash"] for e in evs}


def test_reconciliation_heals_a_hole_the_checkpoint_skipped(router, author) -> None:
    """An event the peer has at an old seq that our checkpoint already passed is fetched, and only it."""
    peer = ReconcilingPeer(router)
    evs = events(author, 20)
    peer.add(*evs)
    local = make_relay()
    for env in evs:
        if env is not evs[4]:
            local.submit(raw(env))
    clock = Clock()
    state = FederationState()
    st = state.get(peer.origin)
    st.checkpoint = st.peer_checkpoint = peer.relay.store.checkpoint()
    st.last_reconcile = clock.now - 7200 * 1000  # due: the default interval is an hour
    state.put(st)
    engine = make_engine(local, [peer_of(peer)], state, clock=clock)
    result = engine.sync_peer(engine.peers[0])
    assert result.ok, result.error
    assert peer.fetched() == [evs[4]["hash"]]
    assert local.store.get(evs[4]["hash"]) is not None
    # not due again before the interval: the next pass only pulls
    calls = peer.reconcile_calls
    engine.sync_peer(engine.peers[0])
    assert peer.reconcile_calls == calls


def test_a_peer_without_reconcile_is_pulled_with_a_note(router, author) -> None:
    peer = FakePeer(router)
    evs = events(author, 5)
    peer.add(*evs)
    local = make_relay()
    local.submit(raw(evs[0]))
    engine = make_engine(local, [peer_of(peer)])
    result = engine.sync_peer(engine.peers[0])
    assert result.ok and result.accepted == 4 and result.duplicates == 1
    assert engine.state.get(peer.origin).reconcile_note == NOT_ADVERTISED
    assert reconcile_now(engine, engine.peers[0]).supported is False


def test_reconcile_can_be_turned_off(router, author) -> None:
    peer = ReconcilingPeer(router)
    peer.add(*events(author, 3))
    local = make_relay()
    engine = make_engine(local, [peer_of(peer)], reconcile=False)
    assert engine.sync_peer(engine.peers[0]).ok
    assert peer.reconcile_calls == 0


def test_on_demand_reconcile_reports_have_need_rounds_and_bytes(router, author) -> None:
    peer = ReconcilingPeer(router)
    evs = events(author, 50)
    peer.add(*evs[:45])
    local = make_relay()
    for env in evs[3:]:
        local.submit(raw(env))
    engine = make_engine(local, [peer_of(peer)])
    seen = []
    result = reconcile_now(engine, engine.peers[0], progress=lambda r: seen.append(r.rounds))
    assert result.complete and result.need == 3 and result.have == 5 and result.accepted == 3
    assert result.rounds >= 1 and result.sent > 0 and result.received > 0 and result.batches == 1
    assert seen and "have 5, need 3" in result.summary()
    assert "have 5, need 3" in engine.state.get(peer.origin).reconcile_note


def test_three_relays_from_partitions_converge_without_duplicate_fetches(router) -> None:
    """A, B, C hold overlapping sets; after reconciling with each other all hold the union, and
    the batch reads fetched each missing event exactly once per relay that lacked it."""
    authors = [Author(name) for name in ("ann", "bob", "cat", "dan")]
    shared = [a.publish(f"Shared {i}") for i, a in enumerate(authors) for _ in range(1)] + \
        [authors[0].publish(f"Common {i}") for i in range(20)]
    only = {k: [authors[i].publish(f"Only {k} {j}") for j in range(3 + i)] for i, k in enumerate("abc")}
    ab = [authors[3].publish(f"A and B {j}") for j in range(4)]
    nodes = {k: ReconcilingPeer(router, f"https://relay-{k}.example") for k in "abc"}
    nodes["a"].add(*shared, *only["a"], *ab)
    nodes["b"].add(*shared, *only["b"], *ab)
    nodes["c"].add(*shared, *only["c"])
    union = {e["hash"] for e in shared + ab + only["a"] + only["b"] + only["c"]}
    lacked = {k: union - {r.id for r in n.relay.store.iter_records(0, 10_000)} for k, n in nodes.items()}
    fetched_by: dict[str, list[str]] = {k: [] for k in "abc"}
    engines = {}
    for k, n in nodes.items():
        others = [peer_of(nodes[o]) for o in "abc" if o != k]
        engines[k] = make_engine(n.relay, others)
    for k in "abc":
        before = {o: len(nodes[o].fetched()) for o in "abc"}
        for r in engines[k].run_once():
            assert r.ok, r.error
        fetched_by[k] = [h for o in "abc" for h in nodes[o].fetched()[before[o]:]]
    for k, n in nodes.items():
        assert {r.id for r in n.relay.store.iter_records(0, 10_000)} == union, k
        assert sorted(fetched_by[k]) == sorted(lacked[k]), k  # each missing event fetched once, nothing else


def test_local_origin_is_the_initiator() -> None:
    assert LOCAL.startswith("https://")


def test_the_initiator_asks_for_the_largest_answers_a_peer_advertises(router, author) -> None:
    """A peer advertising ``max_frame_limit`` is asked for answers that large; an older peer, for none."""
    evs = events(author, 20)
    for advertised in (True, False):
        peer = ReconcilingPeer(router, f"https://peer-{int(advertised)}.example")
        if not advertised:
            del peer.discovery_doc["reconcile"]["max_frame_limit"]
        peer.add(*evs)
        local = make_relay()
        for env in evs[2:]:
            local.submit(raw(env))
        engine = make_engine(local, [peer_of(peer)])
        result = reconcile_now(engine, engine.peers[0])
        assert result.complete and result.need == 2 and result.accepted == 2
        assert peer.frame_limits and set(peer.frame_limits) == ({MAX_MESSAGE} if advertised else {60_000})


def test_a_peers_max_frame_limit_is_taken_only_when_it_is_sane() -> None:
    origin = "https://peer.example"

    def caps(value: object) -> Capabilities:
        member = discovery(origin)["reconcile"] | {"max_frame_limit": value}
        return capabilities({"reconcile": member}, origin, None)

    assert caps(100_000).max_frame_limit == 100_000
    assert caps(10**12).max_frame_limit == MAX_MESSAGE  # never more than we read
    for hostile in (4095, 0, -1, "262144", 262144.0, True, None, [262144]):
        assert caps(hostile).max_frame_limit is None, hostile
