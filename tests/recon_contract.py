"""The reconciliation index contract every backend must pass (issue 26, :mod:`akrelay.store.recon`).

A backend's test module subclasses :class:`ReconContract` and provides ``new_store``
(a fresh, empty store). The oracle is :class:`akrelay.protocol.reconcile.SortedItems`
over the records a peer can fetch (retained, not withheld): the store's view must give
the same size, items, ids and fingerprints for every range, through commits, withholding,
showing again and removal, and a reconciliation over it must find exactly the difference.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Callable

import pytest

from unittest.mock import patch

from akrelay.protocol import reconcile
from akrelay.protocol.reconcile import ALIGN_SHIFTS, INFINITY, ZERO, Bound, Reconciler, SortedItems
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


def spread_and_bursts(rng: random.Random, n: int) -> set:
    """Items spread over every level, in bursts inside one 256 ms bucket, and in between."""
    start = 1_790_000_000_000
    out = set()
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            ts = rng.randrange(2**45)
        elif kind == 1:
            ts = start + rng.randrange(2**26)
        elif kind == 2:
            ts = start + 2**20 + rng.randrange(256)  # one bottom bucket: a burst
        else:
            ts = start + (rng.randrange(64) << rng.choice(ALIGN_SHIFTS[:4]))  # on bucket starts
        out.add((ts, rng.randbytes(32)))
    return out


def random_bound(rng: random.Random, oracle: SortedItems) -> Bound:
    """A bucket start, an item, an item's short prefix, or any timestamp (a hostile peer's bounds)."""
    ts, ident = oracle.item(rng.randrange(oracle.size()))
    kind = rng.randrange(4)
    if kind == 0:
        shift = rng.choice(ALIGN_SHIFTS)
        return Bound((ts >> shift) << shift)
    if kind == 1:
        return Bound(ts, ident)
    if kind == 2:
        return Bound(ts, ident[:rng.randrange(3)])
    return Bound(ts + rng.randrange(-3, 4) if ts > 3 else ts, rng.randbytes(rng.randrange(3)))


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
            columns = getattr(store.recon, "recon_columns", None)
            if columns is not None:  # nothing to aggregate: empty columns, not a failure
                times, ids = columns(None, None)
                assert (len(times), ids) == (0, b"")
        import akrelay.store.recon as recon

        copy = recon.snapshot_items(store.recon)
        assert copy is not None and copy.size() == 0 and copy.fingerprint(0, 0) == SortedItems([]).fingerprint(0, 0)

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
        columns = getattr(store.recon, "recon_columns", None)
        if columns is not None:  # a backend that reads the set as two columns in one statement
            from array import array

            times, ids = columns(None, None)
            assert list(zip(times, (ids[k:k + 32] for k in range(0, len(ids), 32)))) == sorted(items)
            times, ids = columns(1_790_000_000_000 + 10**6, 1_790_000_000_000 + 5 * 10**6)
            assert list(times) == sorted(ts for ts, _ in items if 10**6 <= ts - 1_790_000_000_000 < 5 * 10**6)
            # columns out of key order are not trusted: the copy reads pages instead
            backwards = (array("Q", reversed(times)), b"".join(ids[k:k + 32] for k in reversed(range(0, len(ids), 32))))
            monkeypatch.setattr(store.recon, "recon_columns", lambda since, until: backwards, raising=False)
            copy = recon.snapshot_items(store.recon, since=1_790_000_000_000 + 10**6, until=1_790_000_000_000 + 5 * 10**6)
            assert copy is not None and list(copy.ids(0, copy.size())) == [ids[k:k + 32] for k in range(0, len(ids), 32)]

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

    def test_a_responder_copy_answers_as_the_view_and_follows_the_set(self, store) -> None:
        """The responder's copy answers every message with the view's bytes, and is dropped when the set changes."""
        import akrelay.store.recon as recon
        from akrelay.federation.reconcile import respond

        rng = random.Random(9)
        items = {(1_790_000_000_000 + rng.randrange(10**8), rng.randbytes(32)) for _ in range(3000)}
        self.add_items(store, items)
        ours = set(rng.sample(sorted(items), 2700)) | {(1_790_000_000_000 + rng.randrange(10**8), rng.randbytes(32))
                                                        for _ in range(40)}
        now = [0.0]
        copies = recon.ResponderCopy(copy_after=0.5, clock=lambda: now[0])

        def run(expect_need: set) -> None:
            initiator = Reconciler(SortedItems(ours), frame_limit=4096)
            message: bytes | None = initiator.initiate()
            need: set[bytes] = set()
            while message is not None:
                plain = respond(store.recon, message)
                shared = respond(store.recon, message, copies=copies)
                assert shared == plain  # the same answer, from the copy or not
                outcome = initiator.reconcile(shared)
                need |= set(outcome.need)
                message = outcome.message
            assert need == expect_need

        run({i for _, i in items - ours})
        assert copies.copies == 1 and copies.answered > 0  # the rounds read enough: the rest came from a copy
        late = (1_790_000_000_001, b"\x07" * 32)
        self.add_items(store, {late})  # the set changed: the copy no longer stands for it
        items.add(late)
        answered = copies.answered
        run({i for _, i in items - ours})
        assert copies.copies == 2 and copies.answered > answered
        now[0] += recon.RESPONDER_IDLE + 1  # quiet: the copy is given back at the next message
        with store.recon.recon_snapshot():
            view = StoreView(store.recon)
            assert copies.storage(store.recon, view) is view
        windowed = respond(store.recon, Reconciler(SortedItems(ours)).initiate(), since=1, copies=copies)
        assert windowed == respond(store.recon, Reconciler(SortedItems(ours)).initiate(), since=1)
        capped = recon.ResponderCopy(copy_after=0.0, cap=10)
        with store.recon.recon_snapshot():
            view = StoreView(store.recon)
            capped.spent(view)
            assert capped.storage(store.recon, view) is view and capped.copies == 0  # too large to copy

    def test_splits_at_bucket_starts_agree_with_the_items(self, store) -> None:
        """The view's split from bucket rows: every boundary where the items put it, with exact fingerprints."""
        rng = random.Random(26_3)
        items = spread_and_bursts(rng, 900)
        self.add_items(store, items)
        oracle = SortedItems(items)
        n = oracle.size()
        splits_seen = 0
        for _ in range(120):
            low, high = sorted([random_bound(rng, oracle), random_bound(rng, oracle)], key=Bound.key)
            if rng.randrange(5) == 0:
                low = ZERO
            if rng.randrange(5) == 0:
                high = INFINITY
            if low.key() >= high.key():
                continue
            with store.recon.recon_snapshot():
                view = StoreView(store.recon)
                lower, upper = view.lower_bound(0, n, low), view.lower_bound(0, n, high)
                assert (lower, upper) == (oracle.lower_bound(0, n, low), oracle.lower_bound(0, n, high))
                parts = rng.choice([2, 4, 16])
                splits = view.aligned_splits(lower, upper, low, high, parts)
                if splits is None:
                    continue
                splits_seen += 1
                previous = lower
                for bound, index in splits:
                    assert bound.prefix == b"" and bound.timestamp % (1 << ALIGN_SHIFTS[0]) == 0
                    assert low.key() < bound.key() < high.key()
                    assert previous < index < upper
                    assert index == oracle.lower_bound(0, n, bound)
                    assert view.fingerprint(previous, index) == oracle.fingerprint(previous, index)
                    previous = index
                assert view.fingerprint(previous, upper) == oracle.fingerprint(previous, upper)
        assert splits_seen >= 20

    def test_bucket_starts_then_any_bounds_are_located_exactly(self, store) -> None:
        """Ascending bounds as one message brings them: aligned ones (answered from the aggregates) mixed with others."""
        rng = random.Random(26_4)
        items = spread_and_bursts(rng, 700)
        self.add_items(store, items)
        oracle = SortedItems(items)
        n = oracle.size()
        for _ in range(20):
            bounds = sorted({random_bound(rng, oracle) for _ in range(40)}, key=Bound.key)
            with store.recon.recon_snapshot():
                view = StoreView(store.recon)
                previous = 0
                for bound in bounds:
                    index = view.lower_bound(previous, n, bound)
                    assert index == oracle.lower_bound(previous, n, bound)
                    assert view.fingerprint(previous, index) == oracle.fingerprint(previous, index)
                    previous = index

    def test_reconciling_with_aligned_splits_finds_the_differences(self, store) -> None:
        """Both sides split at bucket boundaries (from 8 items on, so that a small set does), or one by counts."""
        rng = random.Random(26_5)
        items = spread_and_bursts(rng, 800)
        self.add_items(store, items)
        ours = sorted(items)
        dropped = set(rng.sample(ours, 40))
        extra = spread_and_bursts(rng, 30)
        theirs = (items - dropped) | extra
        for aligned in (True, False):
            with patch.object(reconcile, "ALIGN_ABOVE", 8):
                initiator = Reconciler(SortedItems(theirs), aligned=aligned, frame_limit=4096)
                message: bytes | None = initiator.initiate()
                have: set[bytes] = set()
                need: set[bytes] = set()
                while message is not None:
                    with store.recon.recon_snapshot():
                        reply = Reconciler(StoreView(store.recon), frame_limit=4096).respond(message)
                    outcome = initiator.reconcile(reply)
                    have |= set(outcome.have)
                    need |= set(outcome.need)
                    message = outcome.message
            assert have == {i for _, i in extra - items}
            assert need == {i for _, i in dropped}

    def test_a_kept_copy_follows_commits_withholding_showing_and_removal(self, store) -> None:
        """The kept copy stands for the store's set after each change once its keeper caught up: news is
        merged in, anything else (withheld, shown again, removed) is copied again; stopped, it answers nothing."""
        from akrelay.store.recon_copy import KeptCopy

        rng = random.Random(31)
        envs = list(corpus())
        half = len(envs) // 2
        for env in envs[:half]:
            store.commit(env, 1_790_000_000_000)
        made: list[int] = []
        kept = KeptCopy(store, store.recon, rebuild_gap=0.0, rebuild_factor=0.0, on_copy=lambda: made.append(1))

        def current() -> Any:
            with store.recon.recon_snapshot():
                return kept.current(StoreView(store.recon))

        def caught_up() -> Any:
            assert kept.refresh(60)
            copy = current()
            assert copy is not None, kept.status()
            oracle = fetchable(store, envs)
            n = oracle.size()
            assert copy.size() == n and list(copy.ids(0, n)) == list(oracle.ids(0, n))
            for _ in range(20):
                i = rng.randrange(n + 1)
                j = rng.randrange(i, n + 1)
                assert copy.fingerprint(i, j) == oracle.fingerprint(i, j)
            return copy

        assert current() is None and not kept.refresh(1)  # never started: nothing kept, nothing waited for
        kept.start()
        try:
            caught_up()
            assert len(made) == 1 and kept.status()["state"] == "kept"
            for env in envs[half:]:
                store.commit(env, 1_790_000_000_001)
            behind = current()  # behind the store by news
            if hasattr(store.recon, "recon_news"):  # read in the message's snapshot, and merged at once
                assert behind is not None and behind.size() == len(envs) and kept.caught_up_inline == 1
            else:  # the keeper is woken, and the message answered from the store
                assert behind is None
            caught_up()
            assert len(made) == 1 and kept.catch_ups + kept.caught_up_inline == 1  # merged in, not copied again
            hidden = rng.sample(envs, 3)
            for env in hidden:
                assert store.set_withheld(env.id, True)
            caught_up()
            assert len(made) == 2  # a withholding is no news in the log: copied again
            store.set_withheld(hidden[0].id, False)
            caught_up()
            assert len(made) == 3
            for env in rng.sample([e for e in envs if e not in hidden], 2):
                assert store.remove(env.id)
            caught_up()
            assert len(made) == 4
        finally:
            kept.stop()
        assert current() is None and kept.status()["state"] == "off"

    def test_a_kept_copy_copies_again_at_most_once_per_gap_and_never_past_its_cap(self, store) -> None:
        from akrelay.store.recon_copy import KeptCopy

        envs = list(corpus())
        for env in envs:
            store.commit(env, 1_790_000_000_000)
        now = [0.0]
        kept = KeptCopy(store, store.recon, rebuild_gap=100.0, rebuild_factor=0.0, clock=lambda: now[0])

        def current() -> Any:
            with store.recon.recon_snapshot():
                return kept.current(StoreView(store.recon))

        kept.start()
        try:
            assert kept.refresh(60) and current() is not None and kept.copies == 1
            assert store.set_withheld(envs[0].id, True)
            assert kept.refresh(60) and current() is None and kept.copies == 1  # within the gap: no second copy
            now[0] += 101.0
            assert kept.refresh(60) and current() is not None and kept.copies == 2
        finally:
            kept.stop()
        kept.start()  # started again inside the gap: a restart copies at once
        try:
            assert kept.refresh(60) and current() is not None and kept.copies == 3
        finally:
            kept.stop()
        small = KeptCopy(store, store.recon, cap=3)
        small.start()
        try:
            assert small.refresh(60) and current() is None
            with store.recon.recon_snapshot():
                assert small.current(StoreView(store.recon)) is None
            assert small.status()["state"] == "over the cap" and small.copies == 0
        finally:
            small.stop()

    def test_news_are_the_records_after_a_seq_as_items(self, store) -> None:
        """A backend's optional ``recon_news`` says what ``iter_records`` does, withheld records as ``None``."""
        news = getattr(store.recon, "recon_news", None)
        if news is None:
            pytest.skip("this backend has no recon_news: the kept copy reads iter_records")
        envs = list(corpus())
        for env in envs:
            store.commit(env, 1_790_000_000_000)
        store.set_withheld(envs[3].id, True)
        store.remove(envs[5].id)
        expected = [(r.seq, None if r.withheld else (r.envelope.created_at, event_hash_bytes(r.id)))
                    for r in store.iter_records(2, 10_000)]
        assert news(2, 10_000) == expected and expected[1][1] is None  # envs[3] is the second after seq 2
        assert news(2, 4) == expected[:4] and news(10**9, 10) == []


    def test_a_kept_copy_under_writes_catches_up_without_copying_again(self, store) -> None:
        """Commits that land between the keeper's read of the news and its check of the set are news
        too: the keeper takes them in at its next wake-up, and never copies the whole set for them."""
        from akrelay.store.recon_copy import KeptCopy

        envs = list(corpus())
        for env in envs[:10]:
            store.commit(env, 1_790_000_000_000)
        kept = KeptCopy(store, store.recon, rebuild_gap=10**9, rebuild_factor=0.0, clock=lambda: 0.0)
        pending = iter(envs[10:])
        inside: list[bool] = []

        def busy(real: Callable[..., Any]) -> Callable[..., Any]:
            def read(*args: Any) -> Any:
                out = real(*args)
                if inside or threading.current_thread().name != "akrelay-recon-copy":
                    return out  # the store's own reads (a Redis commit reads the log too)
                env = next(pending, None)
                if env is not None:  # a commit right after the keeper read the news
                    inside.append(True)
                    try:
                        store.commit(env, 1_790_000_000_001)
                    finally:
                        inside.clear()
                return out
            return read

        kept.start()
        try:
            assert kept.refresh(60) and kept.copies == 1
            with patch.object(store.recon, "recon_news", busy(store.recon.recon_news), create=False) \
                    if hasattr(store.recon, "recon_news") else patch.object(store, "iter_records",
                                                                            busy(store.iter_records)):
                store.commit(envs[10], 1_790_000_000_001)
                next(pending)
                for _ in range(len(envs)):
                    assert kept.refresh(60)
                    with store.recon.recon_snapshot():
                        found = kept.current(StoreView(store.recon))
                    if found is not None and found.size() == len(envs):
                        break  # all of it taken in (SQLite may answer from a copy behind by news before)
                with store.recon.recon_snapshot():
                    copy = kept.current(StoreView(store.recon))
            assert copy is not None and copy.size() == fetchable(store, envs).size() == len(envs)
            assert kept.copies == 1 and kept.catch_ups + kept.caught_up_inline >= 1  # merged in, never copied again
        finally:
            kept.stop()

    def test_without_a_held_kept_copy_the_responder_copy_answers_and_own_set_uses_a_current_one(self, store) -> None:
        import akrelay.store.recon as recon
        from akrelay.federation.reconcile import respond
        from akrelay.store.recon_copy import KeptCopy

        rng = random.Random(12)
        items = {(1_790_000_000_000 + rng.randrange(10**8), rng.randbytes(32)) for _ in range(2000)}
        self.add_items(store, items)
        ours = SortedItems(rng.sample(sorted(items), 1900))
        small = KeptCopy(store, store.recon, cap=10)  # past its cap: it holds nothing
        copies = recon.ResponderCopy(copy_after=0.0)
        small.start()
        try:
            assert small.refresh(60) and not small.holds
            message = Reconciler(ours, frame_limit=4096).initiate()
            assert respond(store.recon, message, kept=small, copies=copies) == respond(store.recon, message)
            with store.recon.recon_snapshot():
                copies.spent(StoreView(store.recon))
            respond(store.recon, message, kept=small, copies=copies)
            assert copies.copies == 1  # the responder's own copy served, as without a kept copy
        finally:
            small.stop()
        kept = KeptCopy(store, store.recon)
        kept.start()
        try:
            assert kept.refresh(60)
            own = recon.OwnSet(store.recon, kept=kept)
            with store.recon.recon_snapshot():
                first = own.storage()
            with store.recon.recon_snapshot():
                assert own.storage(5) is first and isinstance(first, reconcile.PackedItems)
            asked: list[int] = []

            class Behind:
                def current(self, view: StoreView) -> None:
                    asked.append(1)

            stale = recon.OwnSet(store.recon, kept=Behind())
            for step in range(3):
                with store.recon.recon_snapshot():
                    assert isinstance(stale.storage(step), StoreView)
            assert asked == [1]  # a kept copy that is not the set at the first step is not asked every round
            windowed = recon.OwnSet(store.recon, since=1, kept=kept)  # a window is never the kept copy
            with store.recon.recon_snapshot():
                assert isinstance(windowed.storage(), StoreView)
        finally:
            kept.stop()


    def test_a_message_that_finds_the_copy_behind_by_a_few_news_merges_them_at_once(self, store) -> None:
        """Where the news are read in the message's snapshot (SQLite), a message that finds the copy
        lacking only a few of them merges them and is answered exactly; too many news, or a change
        they do not explain (a withholding), leave it to the store and the keeper."""
        import akrelay.store.recon_copy as module
        from akrelay.store.recon_copy import KeptCopy

        if not hasattr(store.recon, "recon_news"):
            pytest.skip("this backend reads no news in a snapshot: a message never merges news itself")
        envs = list(corpus())
        for env in envs[:20]:
            store.commit(env, 1_790_000_000_000)
        kept = KeptCopy(store, store.recon, rebuild_gap=10**9, rebuild_factor=0.0, clock=lambda: 0.0)

        def current() -> Any:
            with store.recon.recon_snapshot():
                return kept.current(StoreView(store.recon))

        kept.start()
        try:
            assert kept.refresh(60)
            assert kept.refresh(60)  # and caught up past the records copied before their seq was read
            held = current()
            assert held is not None and held.size() == 20
            for env in envs[20:23]:
                store.commit(env, 1_790_000_000_001)
            merged = current()  # the keeper sleeps: only the message can have merged them
            assert merged is not None and merged is not held and merged.size() == 23
            assert kept.caught_up_inline == 1 and current() is merged  # the next message finds it current
            assert list(merged.ids(0, 23)) == list(fetchable(store, envs[:23]).ids(0, 23))
            assert list(held.ids(0, 20)) == list(fetchable(store, envs[:20]).ids(0, 20))  # the old one untouched
            for env in envs[23:26]:
                store.commit(env, 1_790_000_000_001)
            with patch.object(module, "NEWS_AT_ONCE", 2):
                assert current() is None  # three news, more than a message takes in at once
            assert kept.refresh(60)  # the keeper takes them in
            assert store.set_withheld(envs[0].id, True)
            store.commit(envs[26], 1_790_000_000_002)
            assert current() is None  # news, and a withholding they cannot explain
            assert kept.refresh(60)  # the keeper: the same verdict, and no copy within the gap
            reads: list[int] = []
            real = store.recon.recon_news

            def counted(*args: Any) -> Any:
                if threading.current_thread().name != "akrelay-recon-copy":
                    reads.append(1)
                return real(*args)

            with patch.object(store.recon, "recon_news", counted):
                assert current() is None
                tried = len(reads)
                assert current() is None and current() is None
                assert len(reads) == tried <= 1  # merged in vain once: later messages do not read the news again
            assert store.set_withheld(envs[0].id, False)
        finally:
            kept.stop()
