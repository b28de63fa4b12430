"""Offering ``have`` after a reconciliation (issue 26), and the ``type`` filter in sync.

The peers are :class:`ReconcilingPeer` relays over respx that also take ``POST
/v1/knowledge/events`` into their own relay (``Relay.submit``: the full verification and
§8.1 pipeline), so an offered event is accepted there only if it verifies. Each test
names the peer's answers it changes.
"""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from akrelay.federation.peers import Peer
from akrelay.federation.reconcile import OFFER_REFUSALS_IN_A_ROW, Filter, discovery, parse_request, respond
from akrelay.federation.runner import reconcile_now
from akrelay.federation.state import FederationState
from akrelay.protocol.errors import ProtocolError

from .conftest import Author, Clock, make_engine, make_relay, raw
from .test_reconcile_sync import ReconcilingPeer, events

EVENTS_PATH = "/v1/knowledge/events"


class OfferedPeer(ReconcilingPeer):
    """A reconciling peer that advertises ``accepts_offers`` (unless told not to) and takes submissions."""

    def __init__(self, router: respx.MockRouter, origin: str = "https://peer-a.example", *,
                 accepts: bool = True) -> None:
        super().__init__(router, origin)
        self.discovery_doc |= discovery(origin, accepts_offers=accepts)
        self.submitted: list[str] = []
        #: called with the envelope; may return a response instead of submitting it
        self.submit_hook = None
        router.post(origin + EVENTS_PATH).mock(side_effect=self._submit)

    def _submit(self, request: httpx.Request) -> httpx.Response:
        envelope = json.loads(request.content)
        self.submitted.append(envelope.get("hash"))
        if self.submit_hook is not None:
            hooked = self.submit_hook(envelope)
            if hooked is not None:
                return hooked
        try:
            record, _ = self.relay.submit(request.content)
        except ProtocolError as exc:
            return httpx.Response(exc.http_status, json=exc.to_wire())
        return httpx.Response(200, content=record.to_json(), headers={"content-type": "application/json"})

    def _reconcile(self, request: httpx.Request) -> httpx.Response:
        """As the endpoint: the filter of the query string narrows our set (``respond`` over our store)."""
        self.reconcile_calls += 1
        window, frame_limit = parse_request(list(request.url.params.multi_items()))
        answer = respond(self.relay.store.recon, request.content, since=window.since, until=window.until,
                         types=window.types, store=self.relay.store, frame_limit=frame_limit)
        return httpx.Response(200, content=answer, headers={"content-type": "application/octet-stream"})

    def held(self) -> set[str]:
        return {r.id for r in self.relay.store.iter_records(0, 1_000_000)}


def peer_of(p: ReconcilingPeer, **kw) -> Peer:
    return Peer(origin=p.origin, **kw)


def setup(router, author: Author, *, ours_only: int = 5, shared: int = 20, **peer_kw):
    """A peer holding ``shared`` events; we hold those and ``ours_only`` more (a publish and its assessment)."""
    peer = OfferedPeer(router, **peer_kw)
    common = events(author, shared)
    peer.add(*common)
    local = make_relay()
    extra = []
    for i in range(ours_only):
        extra.append(author.publish(f"Ours {i}") if i % 2 == 0 else author.assess(extra[-1]))
    for env in common + extra:
        local.submit(raw(env))
    return peer, local, extra


def test_reconcile_offers_what_the_peer_lacks_and_it_verifies_them(router, author) -> None:
    peer, local, extra = setup(router, author)
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0])
    assert result.complete and result.have == 5 and result.need == 0, result.summary()
    # in our seq order: each assessment after the publication it targets, so the peer accepts all
    assert peer.submitted == [e["hash"] for e in extra]
    assert result.offered == result.offers_accepted == 5 and result.offers_refused == 0
    assert {e["hash"] for e in extra} <= peer.held()
    st = engine.state.get(peer.origin)
    assert st.counts["offered"] == st.counts["offers_accepted"] == 5
    assert "offered 5: 5 stored, 0 refused" in st.reconcile_note
    # idempotent: the sets are equal now, nothing more is offered
    again = reconcile_now(engine, engine.peers[0])
    assert again.complete and again.have == 0 and again.offered == 0
    assert len(peer.submitted) == 5


def test_a_forged_record_never_leaves_our_store_as_an_offer(router, author) -> None:
    """What the peer accepts it verified itself: a tampered submission would be refused there."""
    peer, local, extra = setup(router, author, ours_only=1)

    def tamper(envelope: dict):
        envelope["event"]["payload"]["title"] = "Changed"
        try:
            peer.relay.submit(json.dumps(envelope).encode())
        except ProtocolError as exc:
            return httpx.Response(exc.http_status, json=exc.to_wire())
        raise AssertionError("a tampered envelope was accepted")

    peer.submit_hook = tamper
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0])
    assert result.offers_refused == 1 and extra[0]["hash"] not in peer.held()


def test_a_peer_that_does_not_accept_offers_gets_nothing(router, author) -> None:
    peer, local, _ = setup(router, author, accepts=False)
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0])
    assert result.complete and result.have == 5
    assert peer.submitted == [] and result.offered == 0
    assert "does not advertise reconcile.accepts_offers" in engine.state.get(peer.origin).reconcile_note


@pytest.mark.parametrize("how", ["option", "peer file"])
def test_offers_can_be_turned_off(router, author, how) -> None:
    peer, local, _ = setup(router, author)
    if how == "option":
        engine = make_engine(local, [peer_of(peer)], offer=False)
    else:
        engine = make_engine(local, [peer_of(peer, offer=False)])
    result = reconcile_now(engine, engine.peers[0])
    assert result.have == 5 and peer.submitted == []
    assert "not offered" in result.summary()


def test_refusals_are_counted_and_never_offered_again(router, author) -> None:
    peer, local, extra = setup(router, author, ours_only=3)
    peer.submit_hook = lambda env: httpx.Response(
        422, json={"error": {"code": "policy_refused", "message": "not here"}})
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0])
    assert result.offered == result.offers_refused == 3 and result.offers_accepted == 0
    st = engine.state.get(peer.origin)
    assert st.counts["offers_refused"] == 3 and set(st.offer_refused) == {e["hash"] for e in extra}
    assert "3 refused" in st.reconcile_note
    for _ in range(3):  # later reconciliations still learn them as have, but never offer them again
        again = reconcile_now(engine, engine.peers[0])
        assert again.have == 3 and again.offered == 0
    assert len(peer.submitted) == 3


def test_a_peer_refusing_everything_costs_a_bounded_number_of_requests(router, author) -> None:
    peer, local, _ = setup(router, author, ours_only=OFFER_REFUSALS_IN_A_ROW + 10)
    peer.submit_hook = lambda env: httpx.Response(400, json={"error": {"code": "invalid_event", "message": "no"}})
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0])
    assert len(peer.submitted) == OFFER_REFUSALS_IN_A_ROW
    assert result.offers_refused == OFFER_REFUSALS_IN_A_ROW and result.offers_deferred == 10
    assert "refused 16 offers in a row" in result.summary()


def test_a_429_stops_the_offers_and_its_retry_after_is_honoured(router, author) -> None:
    peer, local, extra = setup(router, author)
    calls = []

    def limited(env: dict):
        calls.append(env["hash"])
        if len(calls) == 2:
            return httpx.Response(429, headers={"retry-after": "60"},
                                  json={"error": {"code": "rate_limited", "message": "slow down"}})
        return None

    peer.submit_hook = limited
    clock = Clock()
    engine = make_engine(local, [peer_of(peer)], FederationState(), clock=clock)
    result = reconcile_now(engine, engine.peers[0])
    assert result.offers_accepted == 1 and result.offers_refused == 0 and result.offers_deferred == 4
    st = engine.state.get(peer.origin)
    assert st.offer_retry_at == clock.now + 60_000 and st.offer_refused == []
    assert "offers stopped" in st.reconcile_note
    # within the Retry-After: nothing is offered
    waiting = reconcile_now(engine, engine.peers[0])
    assert waiting.offered == 0 and waiting.offers_deferred == 4 and len(calls) == 2
    clock.now += 61_000
    later = reconcile_now(engine, engine.peers[0])
    assert later.offers_accepted == 4 and {e["hash"] for e in extra} <= peer.held()


def test_offers_per_pass_are_bounded(router, author) -> None:
    peer, local, extra = setup(router, author)
    engine = make_engine(local, [peer_of(peer)], offer_max=2)
    first = reconcile_now(engine, engine.peers[0])
    assert first.offered == 2 and first.offers_deferred == 3
    second = reconcile_now(engine, engine.peers[0])
    assert second.have == 3 and second.offered == 2
    third = reconcile_now(engine, engine.peers[0])
    assert third.offered == 1 and {e["hash"] for e in extra} <= peer.held()


def test_offers_skip_what_the_peer_says_is_too_large(router, author) -> None:
    peer, local, _ = setup(router, author, ours_only=2)
    peer.discovery_doc["limits"] = {"max_envelope_bytes": 64}
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0])
    assert result.have == 2 and peer.submitted == [] and result.offered == 0


def test_a_withheld_record_is_not_offered(router, author) -> None:
    peer, local, extra = setup(router, author, ours_only=1)
    engine = make_engine(local, [peer_of(peer)])
    from akrelay.federation.reconcile import ReconcileResult, offer
    from akrelay.store.base import event_hash_bytes

    local.store.set_withheld(extra[0]["hash"], True)
    result = ReconcileResult(peer.origin, have=1, have_ids=[event_hash_bytes(extra[0]["hash"])])
    with engine.open_transport(engine.peers[0]) as transport:
        offer(engine, engine.peers[0], transport, peer.origin + EVENTS_PATH, engine.state.get(peer.origin), result,
              limit=10)
    assert peer.submitted == [] and result.offered == 0


def test_the_offer_runs_inside_the_periodic_pass_too(router, author) -> None:
    peer, local, extra = setup(router, author)
    engine = make_engine(local, [peer_of(peer)])
    result = engine.sync_peer(engine.peers[0])  # first contact: bootstrap by reconciling, then offer
    assert result.ok, result.error
    assert {e["hash"] for e in extra} <= peer.held()
    assert engine.state.get(peer.origin).counts["offers_accepted"] == 5


# ---- the type filter in sync -----------------------------------------------------------------

def test_a_type_filtered_reconciliation_fetches_only_that_type(router) -> None:
    ann = Author("ann")
    peer = OfferedPeer(router, accepts=False)
    pubs = [ann.publish(f"P {i}") for i in range(6)]
    assessments = [ann.assess(p) for p in pubs[:3]]
    peer.add(*pubs, *assessments)
    local = make_relay()
    for env in pubs[:4]:
        local.submit(raw(env))
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0], window=Filter(types=("knowledge.assess",)))
    assert result.complete, result.summary()
    assert sorted(peer.fetched()) == sorted(a["hash"] for a in assessments)
    assert "type knowledge.assess" in result.summary()
    # a filtered reconciliation covers part of the set: it does not count as the periodic one
    assert engine.state.get(peer.origin).last_reconcile is None


def test_a_type_filter_needs_a_peer_that_takes_it(router, author) -> None:
    peer, local, _ = setup(router, author)
    peer.discovery_doc["reconcile"]["filters"] = ["since", "until"]
    engine = make_engine(local, [peer_of(peer)])
    result = reconcile_now(engine, engine.peers[0], window=Filter(types=("knowledge.publish",)))
    assert not result.complete and "does not take a type filter" in (result.error or "")
    assert peer.reconcile_calls == 0


def test_a_time_window_narrows_both_sides(router, author) -> None:
    peer = OfferedPeer(router, accepts=False)
    evs = events(author, 10)
    peer.add(*evs)
    local = make_relay()
    for env in evs:
        if env not in (evs[2], evs[8]):
            local.submit(raw(env))
    engine = make_engine(local, [peer_of(peer)])
    since = evs[5]["event"]["created_at"]
    result = reconcile_now(engine, engine.peers[0], window=Filter(since=since))
    assert result.complete and result.need == 1 and peer.fetched() == [evs[8]["hash"]]
    assert f"(created_at >= {since})" in result.summary()


def test_peers_status_says_why_a_peer_is_only_pulled_and_what_was_offered(router, author, tmp_path, capsys) -> None:
    """The fallback note for a peer without reconcile, and the offers of one with it, as `peers status` prints them."""
    from akrelay.cli import main
    from akrelay.federation.reconcile import NOT_ADVERTISED
    from akrelay.federation.state import STATE_FILE

    from .conftest import FakePeer

    plain = FakePeer(router, "https://plain.example")
    plain.add(*events(Author("bob"), 2))
    offered, local, _ = setup(router, author)
    state = FederationState(tmp_path / STATE_FILE)
    engine = make_engine(local, [peer_of(plain), peer_of(offered)], state)
    for result in engine.run_once():
        assert result.ok, result.error
    state.close()
    capsys.readouterr()
    assert main(["peers", "status", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    plain_part, offered_part = out.split("https://plain.example")[1], out.split("https://peer-a.example")[1]
    assert NOT_ADVERTISED in plain_part.split("counts")[0]
    # ours five, and the two just pulled from the plain peer: a relay passes on what it learned
    assert "offered 7: 7 stored, 0 refused" in offered_part.split("counts")[0]
    assert "offers_accepted=7" in offered_part


def test_a_slow_peer_delays_its_own_pass_by_the_offer_time_at_most(router, author, monkeypatch) -> None:
    """Each offer answered 'slowly' (a clock that moves 25 s per reading): the offers stop after
    OFFER_SECONDS and the rest are deferred, not sent one read_timeout after another."""
    import akrelay.federation.reconcile as module

    peer, local, _ = setup(router, author)
    engine = make_engine(local, [peer_of(peer)])
    ticks = iter(range(0, 10_000_000, 25))
    monkeypatch.setattr(module, "_monotonic", lambda: float(next(ticks)))
    result = reconcile_now(engine, engine.peers[0])
    assert result.complete
    assert 0 < len(peer.submitted) < 5 and result.offers_deferred == 5 - len(peer.submitted)
    assert "offers stopped after 60 s" in result.summary()
