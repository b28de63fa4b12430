"""The reconciliation index contract every backend must pass (issue 26, :mod:`akrelay.store.recon`).

A backend's test module subclasses :class:`ReconContract` and provides ``new_store``
(a fresh, empty store). The oracle is :class:`akrelay.protocol.reconcile.SortedItems`
over the records a peer can fetch (retained, not withheld): the store's view must give
the same size, items, ids and fingerprints for every range, through commits, withholding,
showing again and removal, and a reconciliation over it must find exactly the difference.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest

from akrelay.protocol.reconcile import INFINITY, Bound, Reconciler, SortedItems
from akrelay.store.base import event_hash_bytes
from akrelay.store.recon import StoreView, ViewBudgetExceeded
from store_contract import corpus


def fetchable(store: Any, envelopes: list) -> SortedItems:
    items = []
    for env in envelopes:
        record = store.get(env.id)
        if record is not None and not record.withheld:
            items.append((env.created_at, event_hash_bytes(env.id)))
    return SortedItems(items)


def assert_view_matches(store: Any, oracle: SortedItems, rng: random.Random, checks: int = 60) -> None:
    with store.recon.recon_snapshot():
        view = StoreView(store.recon)
        n = oracle.size()
        assert view.size() == n
        assert view.fingerprint(0, n) == oracle.fingerprint(0, n)
        for _ in range(checks):
            i = rng.randrange(n + 1)
            j = rng.randrange(i, n + 1)
            assert view.fingerprint(i, j) == oracle.fingerprint(i, j), (i, j)
            assert list(view.ids(i, j)) == list(oracle.ids(i, j)), (i, j)
            if i < n:
                assert view.item(i) == oracle.item(i)
                bound = Bound(*oracle.item(i))
                assert view.lower_bound(0, n, bound) == oracle.lower_bound(0, n, bound)
        assert view.lower_bound(0, n, INFINITY) == n
    with store.recon.recon_snapshot():  # the same answers after small ranges were prefetched
        view = StoreView(store.recon)
        for _ in range(checks // 4):
            i = rng.randrange(n + 1)
            view.prefetch(i, min(n, i + rng.randrange(2, 200)))
        for _ in range(checks):
            i = rng.randrange(n + 1)
            j = rng.randrange(i, n + 1)
            assert view.fingerprint(i, j) == oracle.fingerprint(i, j), (i, j)
            if i < n:
                assert view.item(i) == oracle.item(i)
                bound = Bound(*oracle.item(i))
                assert view.lower_bound(0, n, bound) == oracle.lower_bound(0, n, bound)
                short = Bound(oracle.item(i)[0], oracle.item(i)[1][:1])
                assert view.lower_bound(0, n, short) == oracle.lower_bound(0, n, short)


class ReconContract:
    new_store: Callable[[], Any]

    @staticmethod
    def add_items(store: Any, items: set) -> None:
        """Put synthetic items straight into the backend's index (no records behind them)."""
        raise NotImplementedError

    @staticmethod
    def discard_items(store: Any, items: set) -> None:
        raise NotImplementedError

    @pytest.fixture
    def store(self, new_store):
        return new_store()

    def test_the_view_follows_commits_withholding_and_removal(self, store) -> None:
        rng = random.Random(26)
        envs = list(corpus())
        for env in envs:
            store.commit(env, 1_790_000_000_000)
        assert_view_matches(store, fetchable(store, envs), rng)
        hidden = rng.sample(envs, 8)
        for env in hidden:
            assert store.set_withheld(env.id, True)
        assert_view_matches(store, fetchable(store, envs), rng)
        for env in hidden[:3]:
            store.set_withheld(env.id, False)
        store.set_withheld(hidden[0].id, False)  # twice: the index must not count it twice
        for env in rng.sample(envs, 5):
            store.remove(env.id)
        assert_view_matches(store, fetchable(store, envs), rng)

    def test_an_empty_store_has_an_empty_view(self, store) -> None:
        with store.recon.recon_snapshot():
            view = StoreView(store.recon)
            assert view.size() == 0
            assert view.lower_bound(0, 0, INFINITY) == 0
            assert Reconciler(view).respond(Reconciler(SortedItems([])).initiate())[0] == 0x61

    def test_reconciling_against_the_store_finds_the_difference(self, store) -> None:
        envs = list(corpus())
        for env in envs:
            store.commit(env, 1)
        theirs = [(e.created_at, event_hash_bytes(e.id)) for e in envs[4:]] + [(5, b"\x01" * 32)]
        initiator = Reconciler(SortedItems(theirs))
        message: bytes | None = initiator.initiate()
        have: set[bytes] = set()
        need: set[bytes] = set()
        while message is not None:
            with store.recon.recon_snapshot():
                reply = Reconciler(StoreView(store.recon)).respond(message)
            outcome = initiator.reconcile(reply)
            have |= set(outcome.have)
            need |= set(outcome.need)
            message = outcome.message
        assert have == {b"\x01" * 32}
        assert need == {event_hash_bytes(e.id) for e in envs[:4]}

    def test_a_view_stops_at_its_budget(self, store) -> None:
        for env in corpus():
            store.commit(env, 1)
        with store.recon.recon_snapshot(), pytest.raises(ViewBudgetExceeded):
            view = StoreView(store.recon, budget=3)
            for i in range(view.size()):
                view.item(i)

    def test_items_spread_over_every_level(self, store) -> None:
        """Timestamps from 0 to 2^53 - 1, clustered and spread, straight into the index (no envelopes)."""
        rng = random.Random(53)
        items = {(rng.choice([0, 1, 255, 256, 2**53 - 1, rng.randrange(2**53), 1_790_000_000_000 + rng.randrange(10**6)]),
                  rng.randbytes(32)) for _ in range(600)}
        self.add_items(store, items)
        oracle = SortedItems(items)
        assert_view_matches(store, oracle, rng, checks=150)
        gone = set(rng.sample(sorted(items), 100))
        self.discard_items(store, gone)
        assert_view_matches(store, SortedItems(items - gone), rng, checks=150)
        for since, until in [(0, 1), (256, 2**53), (1_790_000_000_000, 1_790_000_500_000)]:
            window = SortedItems(i for i in items - gone if since <= i[0] < until)
            with store.recon.recon_snapshot():
                view = StoreView(store.recon, since=since, until=until)
                assert view.size() == window.size()
                assert view.fingerprint(0, view.size()) == window.fingerprint(0, window.size())
                if window.size():
                    assert view.item(0) == window.item(0) and view.item(view.size() - 1) == window.item(window.size() - 1)

    def test_a_snapshot_copies_exactly_the_view(self, store, monkeypatch) -> None:
        """The initiator's in-memory copy holds the view's items, in pages, and gives up past its cap."""
        import akrelay.store.recon as recon

        rng = random.Random(7)
        items = {(1_790_000_000_000 + rng.randrange(10**7), rng.randbytes(32)) for _ in range(300)}
        self.add_items(store, items)
        monkeypatch.setattr(recon, "SNAPSHOT_PAGE", 7)  # many pages, each starting at the last item of the one before
        for since, until in [(None, None), (1_790_000_000_000 + 10**6, None), (None, 1_790_000_000_000 + 5 * 10**6)]:
            window = SortedItems(i for i in items if (since is None or since <= i[0]) and (until is None or i[0] < until))
            copy = recon.snapshot_items(store.recon, since=since, until=until)
            assert copy is not None and copy.size() == window.size()
            assert list(copy.ids(0, copy.size())) == list(window.ids(0, window.size()))
            assert copy.fingerprint(0, copy.size()) == window.fingerprint(0, window.size())
        assert recon.snapshot_items(store.recon, cap=299) is None
        assert recon.snapshot_items(store.recon, cap=300) is not None

    def test_the_initiator_copies_its_set_only_once_its_rounds_have_read_enough(self, store) -> None:
        import akrelay.store.recon as recon

        rng = random.Random(8)
        items = {(1_790_000_000_000 + rng.randrange(10**7), rng.randbytes(32)) for _ in range(200)}
        self.add_items(store, items)
        oracle = SortedItems(items)
        for copy_after, copies in [(float("inf"), False), (0.0, True)]:
            own = recon.OwnSet(store.recon, copy_after=copy_after)
            for _ in range(3):
                with store.recon.recon_snapshot():
                    storage = own.storage()
                    assert storage.fingerprint(0, storage.size()) == oracle.fingerprint(0, oracle.size())
                    storage.item(100)  # some reads
            assert (own.copy is not None) == copies
            assert own.view_reads > 0
        capped = recon.OwnSet(store.recon, copy_after=0.0, cap=10)
        for _ in range(3):
            with store.recon.recon_snapshot():
                assert isinstance(capped.storage(), recon.StoreView)  # too large to copy: the aggregates
        assert capped.copy is None
