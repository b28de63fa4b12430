"""The reconciliation index contract (tests/recon_contract.py) on the memory and SQLite backends,
and the SQLite back-fill of a data directory written before the index existed (schema version 2)."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from akrelay.store.memory import MemoryStore
from akrelay.store.recon import StoreView
from akrelay.store.sqlite import SqliteStore
from akrelay.store.sqlite_recon import recon_add, recon_discard
from akrelay.store.sqlite_schema import SCHEMA as STORE_SCHEMA
from recon_contract import ReconContract, fetchable
from store_contract import corpus


class TestMemoryRecon(ReconContract):
    @pytest.fixture
    def new_store(self):
        return MemoryStore

    @staticmethod
    def add_items(store, items) -> None:
        store.recon.add(items)

    @staticmethod
    def discard_items(store, items) -> None:
        store.recon.discard(items)


class TestSqliteRecon(ReconContract):
    @pytest.fixture
    def new_store(self, tmp_path: Path):
        counter = itertools.count()
        return lambda: SqliteStore(tmp_path / f"fresh-{next(counter)}.sqlite3")

    @staticmethod
    def add_items(store, items) -> None:
        store._write(lambda c: recon_add(c, sorted(items)))

    @staticmethod
    def discard_items(store, items) -> None:
        store._write(lambda c: recon_discard(c, sorted(items)))


def test_an_existing_data_directory_is_back_filled(tmp_path: Path) -> None:
    path = tmp_path / "relay.sqlite3"
    store = SqliteStore(path)
    envs = list(corpus())
    for env in envs:
        store.commit(env, 1)
    store.set_withheld(envs[0].id, True)
    store.close()
    conn = sqlite3.connect(path)  # as a relay before issue 26 left it: version 2, no index
    conn.executescript("DROP TABLE recon_items; DROP TABLE recon_buckets; PRAGMA user_version = 2;")
    conn.close()
    store = SqliteStore(path)
    try:
        oracle = fetchable(store, envs)
        assert oracle.size() == len(envs) - 1
        with store.recon.recon_snapshot():
            view = StoreView(store.recon)
            assert view.size() == oracle.size()
            assert view.fingerprint(0, view.size()) == oracle.fingerprint(0, oracle.size())
    finally:
        store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == STORE_SCHEMA.version


class TestRedisRecon(ReconContract):
    @pytest.fixture
    def new_store(self, redis_url):
        from akrelay.store.redis.store import RedisStore

        namespaces = itertools.count()
        opened: list = []

        def fresh():
            store = RedisStore(redis_url, namespace=f"recon{next(namespaces)}-{id(opened)}")
            opened.append(store)
            return store

        yield fresh
        for store in opened:
            store._client.flushdb()
            store.close()

    @staticmethod
    def add_items(store, items) -> None:
        store.recon.add(sorted(items))

    @staticmethod
    def discard_items(store, items) -> None:
        store.recon.discard(sorted(items))


def test_a_redis_deployment_written_before_the_index_is_back_filled(redis_url) -> None:
    """``rc:*`` absent (a deployment from before issue 26): the first read indexes every fetchable record."""
    from akrelay.store.redis.store import RedisStore

    store = RedisStore(redis_url, namespace="recon-backfill")
    try:
        envs = list(corpus())
        for env in envs:
            store.commit(env, 1)
        store.set_withheld(envs[1].id, True)
        client = store._client
        for key in client.scan_iter(match=b"recon-backfill:rc:*"):
            client.delete(key)
        assert store.recon.indexed_seq() == 0
        oracle = fetchable(store, envs)
        with store.recon.recon_snapshot():
            view = StoreView(store.recon)
            assert view.size() == oracle.size() == len(envs) - 1
            assert view.fingerprint(0, view.size()) == oracle.fingerprint(0, oracle.size())
        assert store.recon.indexed_seq() == store.checkpoint()
    finally:
        store._client.flushdb()
        store.close()


def test_ascending_bounds_are_located_by_short_scans_not_descents() -> None:
    """The bounds of one message ascend: each is found from the last by a scan of a few items."""
    import hashlib

    from akrelay.protocol.reconcile import Bound, SortedItems
    from akrelay.store.recon import MemoryReconIndex

    items = [(1_700_000_000_000 + 977 * i, hashlib.sha256(i.to_bytes(4, "big")).digest()) for i in range(20_000)]
    index = MemoryReconIndex()
    index.add(items)
    oracle = SortedItems(items)
    keys = [Bound(*items[k]) for k in range(5_000, 6_000, 10)]

    ascending = StoreView(index)
    for bound in keys:
        assert ascending.lower_bound(0, ascending.size(), bound) == oracle.lower_bound(0, oracle.size(), bound)
    one_by_one = 0
    for bound in keys:
        view = StoreView(index)
        before = view.reads
        assert view.lower_bound(0, view.size(), bound) == oracle.lower_bound(0, oracle.size(), bound)
        one_by_one += view.reads - before
    # about 11 rows and one read per bound from the last, against a descent over the levels each
    assert ascending.reads < 13 * len(keys) < one_by_one


def test_redis_bucket_aggregates_match_python_and_vanish_with_their_items(redis_url) -> None:
    """The apply script sums a chunk's increments per bucket: items that share buckets (a burst of
    commits within a second; the same item twice in one call), limbs near 2^32, and removal down to
    empty buckets give exactly the counts and id sums added up here, and no key is left behind."""
    import random

    from akrelay.store.recon import LEVELS, bucket_deltas
    from akrelay.store.redis.recon import APPLY_CHUNK
    from akrelay.store.redis.store import RedisStore

    rng = random.Random(7)
    burst = [(1_790_000_000_000 + rng.randrange(1000), rng.randbytes(32)) for _ in range(3 * APPLY_CHUNK)]
    heavy = [(1_790_000_000_500, b"\xff" * 31 + bytes([k])) for k in range(APPLY_CHUNK)]  # every limb 0xffffffff
    items = sorted(set(burst + heavy))
    store = RedisStore(redis_url, namespace="recon-apply")
    try:
        assert store.recon.add(items + items[:5]) == len(items)  # the repeats change nothing
        assert store.recon.add(items[:APPLY_CHUNK]) == 0
        gone = items[::3]
        assert store.recon.discard(gone) == len(gone)
        kept = [i for i in items if i not in set(gone)]
        expected = {k: (n, total % 2**256) for k, (n, total) in bucket_deltas(kept, 1).items()}
        for shift in LEVELS:
            got = {(shift, b): (n, s) for b, n, s in store.recon.recon_buckets(shift, 0, None)}
            assert got == {k: v for k, v in expected.items() if k[0] == shift}, shift
            assert store.recon.recon_counts(shift, 0, 2**60) == [(b, n) for (_, b), (n, _) in sorted(got.items())]
        assert store.recon.discard(kept) == len(kept)
        assert sorted(store._client.scan_iter(match=b"recon-apply:rc:*")) == []
    finally:
        store._client.flushdb()
        store.close()


def _own_set_steps(own, steps) -> list[bool]:
    """Drive an OwnSet through ``steps`` of (rows its view reads, the step's Outcome.deferred): copied after each?"""
    from akrelay.store.recon import PackedItems

    copied = []
    deferred = 0
    for reads, left in steps:
        storage = own.storage(deferred)
        if isinstance(storage, StoreView):
            storage.reads = reads  # as though the step had read that many rows of the aggregates
        copied.append(isinstance(storage, PackedItems))
        deferred = left
    return copied


def _memory_own_set(size: int):
    from akrelay.store.recon import MemoryReconIndex, OwnSet

    index = MemoryReconIndex()
    index.add((1_790_000_000_000 + i, i.to_bytes(32, "big")) for i in range(size))
    return OwnSet(index, copy_after=1.0)


def test_the_initiator_copies_when_a_long_sweep_is_ahead_before_its_reads_pay_for_it() -> None:
    """100 rows a step, the deferred part shrinking by 50 of 1,000 items a step: 17 steps and 1,700
    rows ahead, against a copy worth 1,000 rows' reads. The copy comes as soon as the deferred
    part has shrunk once, after 200 rows read (the reads alone would buy it after 10 steps)."""
    own = _memory_own_set(1000)
    copied = _own_set_steps(own, [(100, 900), (100, 850), (100, 800), (100, 750)])
    assert copied == [False, False, True, True]
    assert own.view_reads == 200


def test_a_short_sweep_or_one_that_does_not_shrink_buys_no_copy_early() -> None:
    # a short sweep: 20 rows a step, the deferred part halving: a few dozen rows ahead, far below the set
    own = _memory_own_set(1000)
    assert _own_set_steps(own, [(20, 400), (20, 200), (20, 100), (20, 0), (20, 0)]) == [False] * 5
    # a deferred part that never shrinks says nothing about what is ahead; the reads alone decide
    own = _memory_own_set(1000)
    assert _own_set_steps(own, [(300, 900), (300, 900), (300, 950), (300, 950), (300, 950)]) == [
        False, False, False, False, True]  # 1,200 rows read by the fifth step: over the set's 1,000
    # steps that leave nothing for later (deferred 0) between the shrinking ones keep the trend
    own = _memory_own_set(1000)
    assert _own_set_steps(own, [(100, 900), (100, 0), (100, 850), (100, 0)]) == [False, False, False, True]
