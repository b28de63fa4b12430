"""The Redis store's node-local text index: the contract through the index path, and what must never go wrong.

``q`` candidates come from a trigram file in the node's data directory and are
verified in Redis; records past its position are scanned. These tests hold that
path to the same exactness as the scan (the unchanged contract suite, a few
thousand generated records against the memory backend), and check that a stale,
foreign, corrupt or unknown-format index is rebuilt rather than misread.
"""

from __future__ import annotations

import itertools
import logging
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import redis

from akrelay.protocol.envelope import Envelope
from akrelay.protocol.signer import Signer, publish_event
from akrelay.protocol.text import ascii_fold
from akrelay.store.memory import MemoryStore
from akrelay.store.redis.store import RedisStore
from akrelay.store.redis.text import FORMAT, TEXT_INDEX_FILE
from store_contract import LICENSE, BASE_TIME, StoreContract, envelope_from_signed


class _FullyIndexed(RedisStore):
    """Every commit is followed by a full catch-up: ``q`` goes through the index (small chunks: many calls)."""

    verify_chunk = 3

    def commit_many(self, items):  # noqa: ANN001, ANN201
        out = super().commit_many(items)
        while self.index_text(7):
            pass
        return out


class _HalfIndexed(RedisStore):
    """The index trails the log by about half: indexed candidates, then the scanned tail."""

    verify_chunk = 2

    def commit_many(self, items):  # noqa: ANN001, ANN201
        out = super().commit_many(items)
        if out and out[-1][0].seq % 2 == 0:
            self.index_text(1)
        return out


class _IndexedContract(StoreContract):
    durable = True
    store_class: type[RedisStore]

    @pytest.fixture
    def make_store(self, redis_url, tmp_path):
        return lambda: self.store_class(redis_url, text_index=tmp_path / TEXT_INDEX_FILE, text_indexer=False)

    @pytest.fixture
    def new_store(self, redis_url, tmp_path):
        counter = itertools.count()

        def fresh():
            n = next(counter)
            return self.store_class(redis_url, namespace=f"fresh{n}", text_index=tmp_path / f"t{n}.sqlite3",
                                    text_indexer=False)

        return fresh


class TestRedisFullyIndexed(_IndexedContract):
    store_class = _FullyIndexed


class TestRedisHalfIndexed(_IndexedContract):
    store_class = _HalfIndexed


# -- a few thousand generated records against the memory backend -------------------------------------------

#: Words that make trigram-rich text: ASCII of mixed case, non-ASCII, punctuation, combining marks.
VOCAB = ("Redis", "cache", "eviction", "latency", "Paxos", "raft", "quorum", "ledger", "naïve", "Straße", "日本語",
         "데이터", "ünïcode", "e\u0301te", "key-value", "x.y", "α-β", "GPU", "p99", "ok", "a", "zz", "tail", "mid")


def _generated(n: int, seed: int = 5) -> list[Envelope]:
    rng = random.Random(seed)
    signer = Signer.from_seed(bytes([seed]) * 32)

    def text(k: int) -> str:
        return " ".join(rng.choice(VOCAB) + rng.choice(("", "", "s", "ing", "-x", "Q")) for _ in range(k))

    out = []
    for i in range(n):
        payload = {
            "license": LICENSE, "kind": rng.choice(("claim", "observation")), "title": text(2),
            "statement": text(rng.randrange(1, 6)), "language": "en", "basis": text(2),
            "context": {"scope": text(1), "conditions": [text(1)] if rng.random() < 0.5 else [], "limitations": []},
        }
        if rng.random() < 0.3:
            payload["tags"] = [rng.choice(("t1", "t2"))]
        out.append(envelope_from_signed(signer.sign(publish_event(signer.agent_id, BASE_TIME + i, i + 1, payload))))
    return out


def _terms(envs: list[Envelope], rng: random.Random, count: int) -> list[str]:
    """``q`` terms of 1, 2, 3 and more characters cut from the texts (some across a word boundary) and absent ones."""
    from akrelay.protocol.text import search_text

    texts = [search_text(e) for e in envs]
    out = ["zzz", "redis", "cache", "ok", "a", "é", "日本", "日本語", "데이터", "s-x", "ingq", "e\u0301", "α-β", "straße",
           "tailsq", "naïve", "x.y"]
    while len(out) < count:
        t = rng.choice(texts)
        length = rng.choice((1, 2, 3, 3, 4, 6, 9, 14))
        start = rng.randrange(0, max(1, len(t) - length))
        cut = t[start:start + length]
        if cut and not any(c in cut for c in " \n"):
            out.append(cut)
        elif cut:  # a cut across a word boundary: the part before the space plus the next word's start
            out.append(cut.replace(" ", "").replace("\n", "")[:length] or "q")
    return out


@pytest.fixture(scope="module")
def corpus_3k() -> list[Envelope]:
    return _generated(3000)


def _load(redis_url: str, tmp_path: Path, envs: list[Envelope], *, index_upto: int | None) -> tuple[RedisStore, MemoryStore]:
    store = RedisStore(redis_url, text_index=tmp_path / TEXT_INDEX_FILE, text_indexer=False)
    memory = MemoryStore()
    items = [(e, BASE_TIME + i) for i, e in enumerate(envs)]
    store.commit_many(items)
    memory.commit_many(items)
    if index_upto is None:
        while store.index_text(1000):
            pass
    else:
        store.index_text(index_upto)
    return store, memory


@pytest.mark.parametrize("index_upto", [None, 1700])
def test_index_path_equals_the_memory_backend(redis_url, tmp_path, corpus_3k, index_upto):
    """Every term shape, alone and with filters, paged: the same seqs as the memory store's brute force."""
    store, memory = _load(redis_url, tmp_path, corpus_3k, index_upto=index_upto)
    try:
        rng = random.Random(11)
        for env in rng.sample(corpus_3k, 40):
            assert store.set_withheld(env.id, True) and memory.set_withheld(env.id, True)
        for env in rng.sample(corpus_3k, 20):
            assert store.remove(env.id) and memory.remove(env.id)
        store.verify_chunk = 50  # many verify calls per page
        checked = 0
        for term in _terms(corpus_3k, rng, 90):
            others = rng.choice(([], [ascii_fold(rng.choice(VOCAB))], []))
            q = [term, *others]
            request_terms = rng.choice(((), (), ("tag=t1",), ("type=knowledge.publish",)))
            kw: dict[str, Any] = dict(after_seq=rng.choice((0, 0, 500, 2900)), limit=rng.choice((5, 100, 10_000)),
                                      include_withheld=rng.random() < 0.3,
                                      created_from=rng.choice((None, BASE_TIME + 1000)))
            want = [r.seq for r in memory.query(request_terms, text_terms=q, **kw)]
            got = store.query(request_terms, text_terms=q, **kw)
            assert [r.seq for r in got] == want, (q, request_terms, kw)
            assert all(r.withheld == memory.get(r.id).withheld for r in got)  # type: ignore[union-attr]
            checked += bool(want)
        assert checked > 40  # most terms were found: the test is not vacuous
    finally:
        store.close()


def test_a_wrong_candidate_set_is_caught(redis_url, tmp_path, corpus_3k):
    """The index really drives: records missing from it are missing from the answer (so the exactness tests above can fail)."""
    store, memory = _load(redis_url, tmp_path, corpus_3k[:500], index_upto=None)
    try:
        conn = sqlite3.connect(tmp_path / TEXT_INDEX_FILE)
        conn.execute("DROP TABLE grams")
        conn.execute("CREATE VIRTUAL TABLE grams USING fts5(text, content='', tokenize='trigram case_sensitive 1', "
                     "detail='none')")
        conn.commit()
        conn.close()
        assert memory.query(text_terms=["redis"]) and store.query(text_terms=["redis"]) == []
    finally:
        store.close()


def test_the_index_narrows_what_redis_reads(redis_url, tmp_path, corpus_3k, monkeypatch):
    """A rare term is answered by verifying its few candidates, not by a scan of the log."""
    store, memory = _load(redis_url, tmp_path, corpus_3k, index_upto=None)
    try:
        calls: list[tuple[str, int]] = []
        original = store._script

        def spy(name, args):  # noqa: ANN001, ANN202
            calls.append((name, len(args)))
            return original(name, args)

        monkeypatch.setattr(store, "_script", spy)
        want = [r.seq for r in memory.query(text_terms=["日本語q"], limit=10_000)]
        assert want and [r.seq for r in store.query(text_terms=["日本語q"], limit=10_000)] == want
        assert [name for name, _ in calls] == ["verify"]
        assert calls[0][1] < len(corpus_3k) / 2
    finally:
        store.close()


# -- the index is rebuilt, never misread ------------------------------------------------------------------

def _store(redis_url: str, path: Path, **kw: Any) -> RedisStore:
    return RedisStore(redis_url, text_index=path, text_indexer=False, **kw)


def _catch_up(store: RedisStore) -> None:
    while store.index_text(500):
        pass


def test_a_killed_indexer_resumes_from_its_position(redis_url, tmp_path, corpus_3k):
    path = tmp_path / TEXT_INDEX_FILE
    store = _store(redis_url, path)
    try:
        store.commit_many([(e, 1) for e in corpus_3k[:300]])
        assert store.index_text(100) == 100
        # a transaction that never committed (the process died in it) leaves nothing behind
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO grams (rowid, text) VALUES (999999, 'bogus')")
        conn.close()
        store.close()
        store = _store(redis_url, path)
        assert store.text_index_lag() == 200
        assert store.index_text(1000) == 200 and store.text_index_lag() == 0
        memory = MemoryStore()
        memory.commit_many([(e, 1) for e in corpus_3k[:300]])
        assert [r.seq for r in store.query(text_terms=["cache"], limit=10_000)] == [
            r.seq for r in memory.query(text_terms=["cache"], limit=10_000)]
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["garbage", "version", "other_log", "older_log"])
def test_a_bad_index_is_rebuilt_with_a_warning(redis_url, tmp_path, corpus_3k, caplog, damage):
    path = tmp_path / TEXT_INDEX_FILE
    envs = corpus_3k[:200]
    memory = MemoryStore()
    memory.commit_many([(e, 1) for e in envs])
    store = _store(redis_url, path)
    store.commit_many([(e, 1) for e in envs])
    _catch_up(store)
    store.close()
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 500)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    elif damage == "version":
        conn = sqlite3.connect(path)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(FORMAT + 1),))
        conn.commit()
        conn.close()
    else:
        client = redis.Redis.from_url(redis_url)
        client.flushdb()
        client.close()
        if damage == "older_log":  # the same log restored from a backup, then other records took the same seqs
            store = _store(redis_url, path)
            client = redis.Redis.from_url(redis_url)
            conn = sqlite3.connect(path)
            log_id = conn.execute("SELECT value FROM meta WHERE key = 'log_id'").fetchone()[0]
            conn.close()
            store.meta_set("text-index.log-id", log_id.encode())
            client.close()
            store.close()
        others = _generated(200, seed=9)
        memory = MemoryStore()
        memory.commit_many([(e, 1) for e in others])
        setup = _store(redis_url, tmp_path / "unused.sqlite3")
        setup.commit_many([(e, 1) for e in others])
        setup.close()
    caplog.set_level(logging.WARNING, logger="akrelay.store.redis.text")
    store = _store(redis_url, path)
    try:
        # before the rebuild a reader never uses what it cannot trust: it scans (or the index is empty)
        for term in ("redis", "cache", "日本語"):
            assert [r.seq for r in store.query(text_terms=[term], limit=10_000)] == [
                r.seq for r in memory.query(text_terms=[term], limit=10_000)]
        _catch_up(store)
        assert store.text_index_lag() == 0
        assert "rebuilding" in caplog.text or "rebuild" in caplog.text
        for term in ("redis", "cache", "日本語", "ok"):
            assert [r.seq for r in store.query(text_terms=[term], limit=10_000)] == [
                r.seq for r in memory.query(text_terms=[term], limit=10_000)]
    finally:
        store.close()


def test_a_file_deleted_under_a_running_node_is_recreated(redis_url, tmp_path, corpus_3k, caplog):
    path = tmp_path / TEXT_INDEX_FILE
    store = _store(redis_url, path)
    memory = MemoryStore()
    try:
        store.commit_many([(e, 1) for e in corpus_3k[:300]])
        memory.commit_many([(e, 1) for e in corpus_3k[:300]])
        _catch_up(store)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        assert store.text_index_lag() == 300  # no file: nothing indexed, queries scan
        assert [r.seq for r in store.query(text_terms=["cache"], limit=10_000)] == [
            r.seq for r in memory.query(text_terms=["cache"], limit=10_000)]
        caplog.set_level(logging.WARNING, logger="akrelay.store.redis.text")
        _catch_up(store)
        assert path.exists() and store.text_index_lag() == 0 and "deleted or replaced" in caplog.text
        assert [r.seq for r in store.query(text_terms=["cache"], limit=10_000)] == [
            r.seq for r in memory.query(text_terms=["cache"], limit=10_000)]
    finally:
        store.close()


def test_one_writer_per_data_directory(redis_url, tmp_path, corpus_3k):
    path = tmp_path / TEXT_INDEX_FILE
    a, b = _store(redis_url, path), _store(redis_url, path)
    try:
        a.commit_many([(e, 1) for e in corpus_3k[:50]])
        assert a.index_text(100) == 50
        b.commit_many([(e, 1) for e in corpus_3k[50:60]])
        assert b.index_text(100) == 0  # a holds the lock; b reads what a wrote
        assert b.text_index_lag() == 10
        a.close()
        assert b.index_text(100) == 10 and b.text_index_lag() == 0
    finally:
        a.close()
        b.close()


def test_the_background_indexer_catches_up(redis_url, tmp_path, corpus_3k):
    import time

    store = RedisStore(redis_url, text_index=tmp_path / TEXT_INDEX_FILE)
    assert store._indexer is None  # opening starts nothing
    store.start()
    try:
        store.commit_many([(e, 1) for e in corpus_3k[:400]])
        deadline = time.monotonic() + 60
        while store.text_index_lag() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.text_index_lag() == 0
    finally:
        store.close()
    assert store._indexer is None


def test_serve_over_redis_uses_the_text_index(redis_url, tmp_path):
    from akrelay.relay.core import open_shared_relay

    relay = open_shared_relay(redis_url, data_dir=tmp_path, accept_weak_durability=True)
    try:
        assert relay.store.text_index is not None  # type: ignore[attr-defined]
        assert relay.store.text_index.path == tmp_path / TEXT_INDEX_FILE  # type: ignore[attr-defined]
    finally:
        relay.close()


def _index_until_stuck(url: str, path: str, marker: str, stuck_at: int) -> None:  # pragma: no cover - child, killed
    """Index 7 records at a time; the batch reaching ``stuck_at`` stops inside its write transaction.

    The kill then lands mid-index by construction (a tight loop raced the parent's poll, and a loaded
    machine let it finish first)."""
    import time

    store = RedisStore(url, text_index=path, text_indexer=False)
    index = store.text_index
    real_add = index.add

    class Rows(list):
        def __iter__(self):  # read inside the transaction (after BEGIN IMMEDIATE)
            for row in list.__iter__(self):
                if row[0] >= stuck_at:
                    Path(marker).touch()
                    time.sleep(3600)
                yield row

    index.add = lambda rows, position: real_add(Rows(rows), position)
    while True:
        store.index_text(7)


def test_an_indexer_killed_mid_index_resumes_consistently(redis_url, tmp_path, corpus_3k):
    import multiprocessing
    import os
    import signal
    import time

    path = tmp_path / TEXT_INDEX_FILE
    envs = corpus_3k[:1500]
    store = RedisStore(redis_url, text_index=path, text_indexer=False)
    memory = MemoryStore()
    try:
        store.commit_many([(e, 1) for e in envs])
        memory.commit_many([(e, 1) for e in envs])
        marker = tmp_path / "stuck"
        child = multiprocessing.get_context("spawn").Process(target=_index_until_stuck,
                                                             args=(redis_url, str(path), str(marker), 903))
        child.start()
        deadline = time.monotonic() + 120
        while not marker.exists() and child.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert marker.exists(), "the indexer did not reach the batch it stops in"
        os.kill(child.pid, signal.SIGKILL)
        child.join(60)
        lag = store.text_index_lag()
        assert 0 < lag < 1500  # killed part way
        for term in ("redis", "日本語", "tail-x", "ok"):  # half indexed, half scanned: still exact
            assert [r.seq for r in store.query(text_terms=[term], limit=10_000)] == [
                r.seq for r in memory.query(text_terms=[term], limit=10_000)]
        _catch_up(store)  # the dead writer's lock is gone; this process resumes from the position
        assert store.text_index_lag() == 0
        conn = sqlite3.connect(path)  # every record once: nothing of the killed transaction, nothing twice
        assert conn.execute("SELECT count(*), count(DISTINCT id) FROM grams_docsize").fetchone() == (1500, 1500)
        conn.close()
        for term in ("redis", "日本語", "tail-x", "ok", "α-β"):
            assert [r.seq for r in store.query(text_terms=[term], limit=10_000)] == [
                r.seq for r in memory.query(text_terms=[term], limit=10_000)]
    finally:
        store.close()


def test_a_redis_outage_is_store_unavailable_on_the_index_path(tmp_path, corpus_3k):
    from akrelay.store.base import StoreUnavailable
    from redis_server import RedisServer

    server = RedisServer(tmp_path / "redis").start()
    try:
        store = RedisStore(server.url, text_index=tmp_path / TEXT_INDEX_FILE, text_indexer=False)
        try:
            store.commit_many([(e, 1) for e in corpus_3k[:100]])
            _catch_up(store)
            assert store.query(text_terms=["redis"])
            server.kill()
            for call in (lambda: store.query(text_terms=["redis"]), lambda: store.query(["tag=t1"], text_terms=["redis"]),
                         lambda: store.index_text(10), store.text_index_lag):
                with pytest.raises(StoreUnavailable):
                    call()
            server.start()
            store.ping()
            assert store.query(text_terms=["redis"])
        finally:
            store.close()
    finally:
        server.kill()


def test_q_cursor_pages_stay_complete_while_the_index_moves_and_the_log_grows(redis_url, tmp_path, corpus_3k):
    """One ``q`` enumeration paged by cursor through the relay, with the index catching up and records committed
    between pages (so its position crosses the page boundary and then the checkpoint): exactly the records at or
    below the first page's checkpoint, each once, in ``seq`` order, as the memory backend pages them."""
    from akrelay.relay.config import RelayConfig
    from akrelay.relay.core import Relay

    first, later = corpus_3k[:1500], corpus_3k[1500:]
    store, memory = _load(redis_url, tmp_path, first, index_upto=200)
    relay = Relay(store, RelayConfig(origin="https://relay.test"), cursor_secret=b"k" * 32)
    oracle = Relay(memory, RelayConfig(origin="https://relay.test"), cursor_secret=b"k" * 32)

    def pages(r: Relay, request: list[tuple[str, str]], between: Any = None) -> list[int]:
        seqs: list[int] = []
        cursor = None
        for _ in range(2000):
            page = r.query(request + ([("cursor", cursor)] if cursor else []))
            seqs += [rec.seq for rec in page.records]
            if page.next_cursor is None:
                return seqs
            cursor = page.next_cursor
            if between is not None:
                between()
        raise AssertionError("the enumeration did not end")

    try:
        fed = iter(range(0, len(later), 40))

        def grow() -> None:
            start = next(fed, None)
            if start is not None:  # more records past the first checkpoint, and the index moves on
                items = [(e, BASE_TIME + 1500 + start + k) for k, e in enumerate(later[start:start + 40])]
                store.commit_many(items)
                memory.commit_many(items)
            store.index_text(97)

        checked = 0
        for q, extra in (("redis", []), ("cache latency", []), ("raft", [("type", "knowledge.publish")]),
                         ("tail", [("tag", "t1")])):
            request = [("q", q), ("limit", "9"), *extra]
            want = pages(oracle, request)  # the log as it is now: later commits must not show
            assert pages(relay, request, grow) == want, q
            checked += len(want)
        assert checked > 100 and store.checkpoint() > len(first)  # not vacuous: long enumerations, a growing log
        assert store.text_index_lag() < store.checkpoint() - 200  # the index really moved during the paging
    finally:
        store.close()
