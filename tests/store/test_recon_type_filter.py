"""The ``type`` filter of reconciliation over every backend (issue 26).

``akrelay.federation.reconcile.filtered_items`` reads the filtered set through the store's
term query, not the reconciliation index; it must still be exactly the index's set (the
records a peer can fetch: retained, not withheld) narrowed to those types and the window,
on every backend, through withholding and showing again.
"""

from __future__ import annotations

import random

import pytest

from akrelay.federation.reconcile import Filter, filtered_items
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.reconcile import Reconciler, SortedItems
from akrelay.store.base import event_hash_bytes
from backends import Opener, params
from store_contract import corpus


@pytest.fixture(params=params())
def store(request, tmp_path):
    opened = Opener(request.param, request, tmp_path).log_store()
    yield opened
    opened.close()


def oracle(store, envelopes, window: Filter) -> list[tuple[int, bytes]]:
    out = []
    for env in envelopes:
        record = store.get(env.id)
        if record is None or record.withheld or env.event["type"] not in (window.types or ()):
            continue
        if window.since is not None and env.created_at < window.since:
            continue
        if window.until is not None and env.created_at >= window.until:
            continue
        out.append((env.created_at, event_hash_bytes(env.id)))
    return sorted(out)


def test_the_type_filtered_set_is_the_fetchable_set_of_those_types(store) -> None:
    envelopes = corpus()
    for i, env in enumerate(envelopes):
        store.commit(env, 1_790_000_000_000 + i)
    rng = random.Random(26)
    hidden = rng.sample([e.id for e in envelopes], 8)
    for event_id in hidden:
        store.set_withheld(event_id, True)
    store.set_withheld(hidden[0], False)  # shown again: back in the set
    times = sorted(e.created_at for e in envelopes)
    windows = [Filter(types=("knowledge.publish",)), Filter(types=("knowledge.assess", "knowledge.retract")),
               Filter(types=("knowledge.assess", "knowledge.publish", "knowledge.retract")),
               Filter(since=times[10], until=times[-10], types=("knowledge.publish",))]
    for window in windows:
        items = filtered_items(store, window)
        expected = oracle(store, envelopes, window)
        assert [items.item(i) for i in range(items.size())] == expected, window
        # and a reconciliation against the oracle's set finds nothing to exchange
        initiator = Reconciler(SortedItems(expected))
        reply = Reconciler(items).respond(initiator.initiate())
        outcome = initiator.reconcile(reply)
        assert not outcome.have and not outcome.need
    every = filtered_items(store, Filter(types=("knowledge.assess", "knowledge.publish", "knowledge.retract")))
    from akrelay.store.recon import StoreView

    with store.recon.recon_snapshot():  # (filtered_items reads the store: never inside the index's snapshot)
        view = StoreView(store.recon)
        indexed = [view.item(i) for i in range(view.size())]
    assert indexed == [every.item(i) for i in range(every.size())]  # all types: exactly the index's set


def test_a_set_over_the_limit_is_refused_after_reading_at_most_the_limit(store) -> None:
    envelopes = corpus()
    for i, env in enumerate(envelopes):
        store.commit(env, 1_790_000_000_000 + i)
    with pytest.raises(ProtocolError) as caught:
        filtered_items(store, Filter(types=("knowledge.publish",)), limit=5)
    assert caught.value.code == "invalid_request" and "narrow since/until" in caught.value.message


def test_an_initiator_with_a_type_filter_and_no_store_is_refused_before_any_round() -> None:
    """``learn`` reads its own filtered set through the store: without one it says so, and sends nothing."""
    from akrelay.federation.reconcile import ReconcileResult, learn
    from akrelay.store.recon import MemoryReconIndex

    class NoNetwork:
        def __getattr__(self, name: str):
            raise AssertionError(f"the initiator touched the transport ({name})")

    result = ReconcileResult("https://peer.example")
    with pytest.raises(ValueError, match="type filter reads our own set through the store"):
        learn(NoNetwork(), "https://peer.example/v1/knowledge/reconcile", MemoryReconIndex(), result,
              window=Filter(types=("knowledge.publish",)))
