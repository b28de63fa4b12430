"""The on-disk index: restart (analyzer re-registration), rebuilds, reindex, one writer."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from search_corpus import T0, publication
from tantivy import Document, Index

from akrelay.cli import main
from akrelay.search import SearchEngine
from akrelay.search.index import SEARCH_DIR, SearchIndex, index_dir
from akrelay.search.indexer import LOCK_NAME, IndexerLock
from akrelay.search.engine import reindex


def _lexical(service, text):
    page = json.loads(service.search(json.dumps({"text": text, "mode": "lexical"}).encode()).to_json())
    return page, [h["record"]["envelope"]["hash"] for h in page["result"]]


def _fill(relay, n, word="restart", start=0):
    envelopes = [publication(f"{word} 语言 {i}", "body", nonce=start + i + 1) for i in range(n)]
    for envelope in envelopes:
        relay.store.commit(envelope, T0)
    return envelopes


def test_restart_reregisters_the_analyzer_and_keeps_the_position(env, tmp_path):
    relay = env.disk_relay(tmp_path)
    docs = _fill(relay, 5)
    first = env.service(relay, tmp_path)
    assert first.is_indexer and first.wait_indexed(timeout=60)
    first.close()

    # Without re-registering the custom analyzer, Tantivy cannot index into the
    # reopened index: this is why every open registers it.
    def index_without_registering() -> None:
        writer = Index.open(str(index_dir(tmp_path))).writer(15_000_000, 1)
        doc = Document()
        doc.add_text("grams", "x")
        try:
            writer.add_document(doc)
            writer.commit()
        finally:
            del writer  # release Tantivy's writer lock even though the traceback keeps this frame

    with pytest.raises(ValueError, match="tokenizer"):
        index_without_registering()

    more = _fill(relay, 3, start=100)
    second = env.service(relay, tmp_path)
    assert second.is_indexer
    assert second.index_seq() >= 5  # the committed position survived the restart
    assert second.wait_indexed(timeout=60)
    page, ids = _lexical(second, "语言")
    assert set(ids) == {e.id for e in docs + more} and page["coverage"]["exhaustive"]
    assert page["index_seq"] == page["checkpoint"] == 8


def test_documents_beyond_the_position_are_not_duplicated(env, tmp_path):
    relay = env.disk_relay(tmp_path)
    docs = _fill(relay, 4, word="dup")
    index = SearchIndex.open_writer(index_dir(tmp_path))
    index.add(relay.store.iter_records(0, 10))
    index.commit(2)  # crash-like state: 4 documents committed, position says 2
    index.close()
    del index
    service = env.service(relay, tmp_path)
    assert service.wait_indexed(timeout=60)
    page, ids = _lexical(service, "dup")
    assert sorted(ids) == sorted(e.id for e in docs)
    searcher = service._index.searcher()
    from tantivy import Query

    from akrelay.search.index import SCHEMA
    assert searcher.search(Query.term_query(SCHEMA, "kind", "record"), 100).count == 4


@pytest.mark.parametrize("damage", ["garbage_meta", "delete_segments", "delete_all", "empty_dir"])
def test_corrupt_or_missing_index_is_rebuilt_at_start(env, tmp_path, damage):
    relay = env.disk_relay(tmp_path)
    docs = _fill(relay, 6, word="corrupt")
    service = env.service(relay, tmp_path)
    assert service.wait_indexed(timeout=60)
    service.close()
    path = index_dir(tmp_path)
    if damage == "garbage_meta":
        (path / "meta.json").write_text("{not json")
    elif damage == "delete_segments":
        for file in path.iterdir():
            if file.suffix in (".idx", ".term", ".store", ".pos", ".fast", ".fieldnorm"):
                file.unlink()
    elif damage == "delete_all":
        for file in path.iterdir():
            file.unlink()
        path.rmdir()
    else:
        for file in path.iterdir():
            file.unlink()
    rebuilt = env.service(relay, tmp_path)
    assert rebuilt.is_indexer and rebuilt.wait_indexed(timeout=60)
    page, ids = _lexical(rebuilt, "corrupt")
    assert set(ids) == {e.id for e in docs} and page["coverage"]["exhaustive"]


def test_a_new_configuration_gets_a_new_index_and_old_ones_are_removed(env, tmp_path):
    stale = tmp_path / SEARCH_DIR / "akrelay-lexical-bm25-trigram-000000000000"
    stale.mkdir(parents=True)
    (stale / "meta.json").write_text("{}")
    relay = env.disk_relay(tmp_path)
    _fill(relay, 1)
    service = env.service(relay, tmp_path)
    assert service.wait_indexed(timeout=60)
    assert not stale.exists() and index_dir(tmp_path).is_dir()


def test_reindex_rebuilds_from_the_store_and_refuses_while_a_relay_indexes(env, tmp_path):
    relay = env.disk_relay(tmp_path)
    docs = _fill(relay, 7, word="reindex")
    assert reindex(relay, tmp_path) == 7
    service = env.service(relay, tmp_path)
    assert service.index_seq() == 7  # already complete before the indexer ran
    assert service.is_indexer
    with pytest.raises(RuntimeError, match="running relay"):
        reindex(relay, tmp_path)
    assert main(["reindex", "--data", str(tmp_path)]) == 1
    service.close()
    assert main(["reindex", "--data", str(tmp_path)]) == 0
    page, ids = _lexical(env.service(relay, tmp_path), "reindex")
    assert set(ids) == {e.id for e in docs}
    assert main(["reindex", "--data", str(tmp_path / "nothing-here")]) == 2


def test_a_service_that_does_not_follow_only_reads(env, tmp_path):
    """``follow=False`` (the workers under ``akrelay serve --followers process``): never the indexer, even with
    the lock free; it reads what the indexing process commits."""
    relay = env.disk_relay(tmp_path)
    docs = _fill(relay, 3, word="reader")
    reader = env.service(relay, tmp_path, follow=False)
    assert not reader.is_indexer and reader.index_seq() == 0
    lock = IndexerLock(tmp_path / SEARCH_DIR / LOCK_NAME)
    assert lock.acquire()  # the reader neither holds it nor waits for it
    lock.release()
    indexer = env.service(relay, tmp_path)
    assert indexer.is_indexer and indexer.wait_indexed(timeout=60)
    assert reader.wait_indexed(timeout=60) and not reader.is_indexer
    assert sorted(_lexical(reader, "reader")[1]) == sorted(d.id for d in docs)
    indexer.close()  # the indexing process stops: the reader still does not take over
    time.sleep(0.1)
    assert not reader.is_indexer


def test_indexer_lock_is_exclusive_and_released(tmp_path):
    path = tmp_path / SEARCH_DIR / LOCK_NAME
    a, b = IndexerLock(path), IndexerLock(path)
    assert a.acquire() and not b.acquire()
    a.release()
    assert b.acquire() and b.held
    b.release()


def _worker(data: str, status_dir: str, stop) -> None:
    """A relay worker process; reports its state in its own file (killing a
    process that writes to a shared queue could wedge the queue)."""
    from akrelay.relay.config import RelayConfig
    from akrelay.relay.core import open_relay

    relay = open_relay(data, RelayConfig(origin="https://knowledge.example.com"))
    service = SearchEngine(relay, data, elect_interval=0.1)
    status = Path(status_dir) / f"{os.getpid()}.json"
    while not stop.is_set():
        count, exhaustive = -1, False
        if service.index_seq() >= relay.checkpoint() > 0:
            body = json.dumps({"text": "worker", "mode": "lexical", "limit": 100}).encode()
            page = json.loads(service.search(body).to_json())
            count, exhaustive = len(page["result"]), page["coverage"]["exhaustive"]
        tmp = status.with_suffix(".tmp")
        tmp.write_text(json.dumps({"indexer": service.is_indexer, "count": count, "exhaustive": exhaustive}))
        os.replace(tmp, status)
        time.sleep(0.05)
    service.close()
    relay.close()


def _statuses(status_dir: Path) -> dict[int, dict]:
    out = {}
    for file in status_dir.glob("*.json"):
        try:
            out[int(file.stem)] = json.loads(file.read_text())
        except (ValueError, OSError):
            pass
    return out


def _until(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@pytest.mark.slow
def test_one_writer_among_several_processes_and_failover(env, tmp_path):
    data, status_dir = tmp_path / "data", tmp_path / "status"
    status_dir.mkdir()
    relay = env.disk_relay(data)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_worker, args=(str(data), str(status_dir), stop)) for _ in range(3)]
    for p in procs:
        p.start()
    try:
        assert _until(lambda: len(_statuses(status_dir)) == 3)
        _fill(relay, 10, word="worker")

        def all_see(n):
            states = _statuses(status_dir)
            return states if len(states) == 3 and all(
                s["count"] == n and s["exhaustive"] for s in states.values()) else None

        states = _until(lambda: all_see(10))
        assert states, _statuses(status_dir)  # readers see the writer's commits
        indexers = [pid for pid, s in states.items() if s["indexer"]]
        assert len(indexers) == 1, states  # exactly one writer
        victim = next(p for p in procs if p.pid == indexers[0])
        victim.kill()
        victim.join(60)
        (status_dir / f"{victim.pid}.json").unlink()
        _fill(relay, 5, word="worker", start=50)
        states = _until(lambda: all_see_two(status_dir, 15))
        assert states, _statuses(status_dir)
        assert sum(s["indexer"] for s in states.values()) == 1  # a survivor took over and caught up
    finally:
        stop.set()
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()


def all_see_two(status_dir: Path, n: int):
    states = _statuses(status_dir)
    return states if len(states) == 2 and all(s["count"] == n and s["exhaustive"] for s in states.values()) else None


def test_indexer_thread_commits_at_most_once_per_min_interval_while_records_keep_coming() -> None:
    """Tiny segments made Tantivy's merges the largest search cost under ingest."""
    from akrelay.search.indexer import IndexerThread

    class Busy:  # a follower whose log always has new records
        def __init__(self) -> None:
            self.steps: list[float] = []

        def step(self) -> int:
            self.steps.append(time.monotonic())
            return 10

    follower = Busy()
    thread = IndexerThread(follower, interval=0.01)  # type: ignore[arg-type]
    thread.min_commit_interval = 0.2
    thread.start()
    assert _until(lambda: len(follower.steps) >= 4)
    thread.stop()
    assert not thread.is_alive()
    steps = follower.steps
    # Spacing, a lower bound a loaded machine cannot break (unthrottled, the steps come microseconds apart).
    assert all(b - a >= 0.19 for a, b in zip(steps, steps[1:])), steps
