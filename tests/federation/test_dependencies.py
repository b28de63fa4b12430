"""Missing dependencies: batch resolution from the same peer, bounds, the pending set."""

from __future__ import annotations

import httpx

from akrelay.federation.peers import Peer
from akrelay.federation.state import StateStore

from .conftest import Author, Clock, FakePeer, local_ids, make_engine, make_relay, raw

PEER = "https://peer-a.example"


def start_after(state: StateStore, seq: int, origin: str = PEER) -> None:
    """Pretend earlier passes covered ``seq``, so the next enumeration starts after it."""
    st = state.get(origin)
    st.checkpoint = st.peer_checkpoint = seq
    state.put(st)


def test_missing_dependencies_are_fetched_with_batch_dependencies_first(router, new_state) -> None:
    fake = FakePeer(router)
    alice, bob = Author("alice"), Author("bob")
    base = alice.publish("Base")
    v2 = alice.supersede(base, "Second version")
    review = bob.assess(v2)
    fake.add(base, v2, review)
    local = make_relay()
    state = new_state()
    start_after(state, fake.seq_of(v2))  # only the assessment is enumerated
    [result] = make_engine(local, [Peer(origin=PEER)], state).run_once()
    assert result.ok and result.accepted == 1 and result.resolved == 2 and result.pending == 0
    assert local_ids(local) == [base["hash"], v2["hash"], review["hash"]]  # dependencies first
    assert fake.batch_calls == [[v2["hash"]], [base["hash"]]]


def test_dependency_depth_is_bounded_and_nothing_is_accepted_early(router, new_state) -> None:
    fake = FakePeer(router)
    alice = Author("alice")
    chain = [alice.publish("v0")]
    for i in range(1, 6):
        chain.append(alice.supersede(chain[-1], f"v{i}"))
    fake.add(*chain)
    local = make_relay()
    state = new_state()
    start_after(state, fake.seq_of(chain[-2]))
    engine = make_engine(local, [Peer(origin=PEER)], state, max_depth=2)
    [result] = engine.run_once()
    assert result.ok and result.pending == 1
    assert chain[-1]["hash"] not in local_ids(local)  # never accepted before its dependencies
    assert state.pending_count(PEER) == 1 and state.get(PEER).checkpoint == 6  # and it blocks nothing
    [entry] = state.pending(PEER)
    assert entry.event_id == chain[-1]["hash"]
    # A later pass with a larger budget resolves the whole chain from the pending set.
    engine = make_engine(local, [Peer(origin=PEER)], state, max_depth=10)
    [again] = engine.run_once()
    assert again.ok and state.pending_count(PEER) == 0
    assert local_ids(local)[-6:] == [e["hash"] for e in chain]
    assert state.get(PEER).counts["pending_accepted"] == 1


def test_dependency_count_and_byte_budgets(router, new_state) -> None:
    fake = FakePeer(router)
    alice = Author("alice")
    targets = [alice.publish(f"Member {i}") for i in range(5)]
    collection = alice.publish("All of them", kind="collection",
                               relations=[{"relation": "contains", "target": t["hash"]} for t in targets])
    fake.add(*targets, collection)
    state = new_state()
    start_after(state, 5)
    local = make_relay()
    [r] = make_engine(local, [Peer(origin=PEER)], state, max_dependency_events=3).run_once()
    assert r.pending == 1 and collection["hash"] not in local_ids(local)
    local = make_relay()
    state = new_state()
    start_after(state, 5)
    [r] = make_engine(local, [Peer(origin=PEER, max_batch_bytes=1024)], state).run_once()
    assert r.pending == 1 and collection["hash"] not in local_ids(local)
    local = make_relay()
    state = new_state()
    start_after(state, 5)
    [r] = make_engine(local, [Peer(origin=PEER)], state).run_once()
    assert r.pending == 0 and r.resolved == 5 and local_ids(local)[-1] == collection["hash"]


def test_unobtainable_dependency_stays_pending_persisted_and_is_retried(router, new_state) -> None:
    fake = FakePeer(router)
    alice, bob = Author("alice"), Author("bob")
    base = alice.publish("Base that the peer withholds")
    review = bob.assess(base)
    other = Author("carol").publish("Unrelated")
    fake.add(base, review, other)
    fake.relay.store.set_withheld(base["hash"], True)
    fake.batch_hook = lambda body: None
    local = make_relay()
    state = new_state("fed")
    start_after(state, 1)
    [r] = make_engine(local, [Peer(origin=PEER)], state).run_once()
    assert r.ok and r.pending == 1 and r.accepted == 1  # the unrelated event is not blocked
    assert local_ids(local) == [other["hash"]]
    assert state.get(PEER).checkpoint == 3
    state.close()
    # The pending set survives a restart.
    state = new_state("fed")
    [entry] = state.pending(PEER)
    assert entry.event_id == review["hash"] and entry.missing == (base["hash"],)
    # Still unobtainable: it stays pending, and is never accepted early.
    [r] = make_engine(local, [Peer(origin=PEER)], state).run_once(force=True)
    assert review["hash"] not in local_ids(local) and state.pending_count(PEER) == 1
    assert state.pending(PEER)[0].attempts == 2
    # Within its back-off the entry is retried locally only: the peer is not asked again.
    asked = len(fake.batch_calls)
    make_engine(local, [Peer(origin=PEER)], state).run_once(force=True)
    assert len(fake.batch_calls) == asked and state.pending_count(PEER) == 1
    # The dependency arrives from elsewhere (a client submits it): the next pass accepts the event.
    local.submit(raw(base))
    [r] = make_engine(local, [Peer(origin=PEER)], state).run_once(force=True)
    assert state.pending_count(PEER) == 0 and local_ids(local)[-1] == review["hash"]


def test_pending_set_is_bounded_oldest_first(router, new_state) -> None:
    fake = FakePeer(router)
    alice = Author("alice")
    hidden = [alice.publish(f"Hidden {i}") for i in range(3)]
    reviews = [Author("bob").assess(h) for h in hidden]
    fake.add(*hidden, *reviews)
    for h in hidden:
        fake.relay.store.set_withheld(h["hash"], True)
    state = new_state(max_pending=2)
    start_after(state, 3)
    [r] = make_engine(make_relay(), [Peer(origin=PEER)], state).run_once()
    assert r.pending == 3 and state.pending_count(PEER) == 2
    assert [e.event_id for e in state.pending(PEER)] == [reviews[1]["hash"], reviews[2]["hash"]]
    assert state.get(PEER).counts["pending_dropped"] == 1


def test_future_dated_event_waits_in_pending_until_the_clock_allows_it(router, new_state) -> None:
    fake = FakePeer(router)
    clock = Clock()
    alice = Author("alice")
    future = alice.publish("From the future", created_at=clock.now + 3_600_000)
    fake.relay = make_relay(PEER, clock=lambda: clock.now + 4_000_000)  # the peer's clock runs ahead
    fake.add(future)
    local = make_relay(clock=clock)
    state = new_state()
    engine = make_engine(local, [Peer(origin=PEER)], state, clock=clock)
    [r] = engine.run_once()
    assert r.ok and r.pending == 1 and local_ids(local) == []
    clock.now += 3_600_000
    engine.run_once(force=True)
    assert local_ids(local) == [future["hash"]] and state.pending_count(PEER) == 0


def sync_with_batch_hook(fake: FakePeer, hook, after: int, new_state):
    """One pass from a fresh relay that starts after ``after``, with ``hook`` spoiling batch answers."""
    fake.batch_hook = hook
    local = make_relay()
    state = new_state()
    start_after(state, after)
    [r] = make_engine(local, [Peer(origin=PEER)], state).run_once()
    return r, state.get(PEER), state, local


def test_batch_answers_that_do_not_match_the_request_leave_the_event_pending(router, new_state) -> None:
    fake = FakePeer(router)
    alice = Author("alice")
    base, stranger = alice.publish("Base"), alice.publish("Not requested")
    review = Author("bob").assess(base)
    fake.add(base, stranger, review)
    cases = {
        "not requested": lambda body: body["result"].__setitem__(0, fake.relay.store.get(stranger["hash"]).to_dict()),
        "differs from the requested origin": lambda body: body.update(service="https://evil.example"),
        "exactly once": lambda body: body["missing"].append(base["hash"]),
    }
    for fragment, hook in cases.items():
        r, st, state, local = sync_with_batch_hook(fake, hook, 2, new_state)
        assert r.ok and r.pending == 1 and fragment in st.last_batch_error, (fragment, st.last_batch_error)
        assert st.counts["batch_errors"] == 1 and state.pending_count(PEER) == 1
        assert local_ids(local) == [] and st.checkpoint == 3  # nothing accepted, nothing blocked


def test_forged_dependency_is_not_accepted_and_the_dependent_waits(router, new_state) -> None:
    fake = FakePeer(router)
    base = Author("alice").publish("Base")
    review = Author("bob").assess(base)
    fake.add(base, review)

    def forge(body):
        body["result"][0]["envelope"]["event"]["payload"]["title"] = "Forged"
    fake.batch_hook = forge
    local = make_relay()
    state = new_state()
    start_after(state, 1)
    [r] = make_engine(local, [Peer(origin=PEER)], state).run_once()
    assert r.ok and r.pending == 1 and local_ids(local) == []


def test_batch_server_error_parks_the_event_and_a_later_pass_resolves_it(router, new_state) -> None:
    fake = FakePeer(router)
    base = Author("alice").publish("Base")
    review = Author("bob").assess(base)
    fake.add(base, review)
    fake.batch_hook = lambda body: httpx.Response(502)
    state = new_state()
    start_after(state, 1)
    local = make_relay()
    engine = make_engine(local, [Peer(origin=PEER)], state)
    [r] = engine.run_once()
    st = state.get(PEER)
    assert r.ok and r.pending == 1 and "502" in st.last_batch_error and st.checkpoint == 2
    assert local_ids(local) == []
    fake.batch_hook = None
    engine.run_once(force=True)
    assert local_ids(local) == [base["hash"], review["hash"]] and state.pending_count(PEER) == 0


def test_a_page_commits_in_groups_and_in_page_dependencies_need_no_batch(router, new_state) -> None:
    """The first pass commits admitted envelopes together; a dependency earlier in the
    same page is committed before its dependent is checked again, never fetched."""
    fake = FakePeer(router)
    alice, bob = Author("alice"), Author("bob")
    base = alice.publish("Base")
    v2 = alice.supersede(base, "Second version")
    review = bob.assess(v2)
    others = [bob.publish(f"Independent {i}") for i in range(5)]
    fake.add(base, *others[:2], v2, review, *others[2:])
    local = make_relay()
    groups: list[int] = []
    real_commit = local.commit_admitted

    def spy(items):
        groups.append(len(items))
        return real_commit(items)

    local.commit_admitted = spy
    [result] = make_engine(local, [Peer(origin=PEER)], new_state(), group_size=4).run_once()
    assert result.ok and result.accepted == 8 and result.pending == 0 and result.rejected == 0
    assert fake.batch_calls == []
    assert local_ids(local) == [e["hash"] for e in (base, *others[:2], v2, review, *others[2:])]
    assert sum(groups) == 8 and max(groups) <= 4 and len(groups) < 8


def test_a_batch_answer_of_the_wrong_shape_costs_only_the_event_that_needed_it(router, new_state) -> None:
    """``missing: [["id"]]`` once raised TypeError and ended the pass as an internal error."""
    fake = FakePeer(router)
    alice = Author("alice")
    base = alice.publish("Base")
    review = Author("bob").assess(base)
    after = alice.publish("After the review")
    fake.add(base, review, after)
    cases = {
        "missing list": lambda body: body.update(missing=[[h] for h in body["missing"]] or [[base["hash"]]],
                                                 result=[]),
        "hash list": lambda body: body["result"][0]["envelope"].update(hash=[base["hash"]]),
        "record list": lambda body: body.update(result=[[body["result"][0]]]),
        "seq string": lambda body: body["result"][0].update(seq="1"),
        "result object": lambda body: body.update(result={"0": body["result"][0]}),
    }
    for name, hook in cases.items():
        r, st, _, local = sync_with_batch_hook(fake, hook, 1, new_state)
        assert r.ok and r.error is None, (name, r.error)
        assert r.accepted == 1 and r.pending == 1, name  # the later event is not held up
        assert st.counts["batch_errors"] == 1 and st.checkpoint == 3, name
        assert "invalid batch response" in st.last_batch_error, (name, st.last_batch_error)
        assert local_ids(local) == [after["hash"]], name
