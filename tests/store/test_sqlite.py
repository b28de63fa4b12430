"""The SQLite backend: the storage contract plus what only a file store can show.

Several processes on one data file, reopening after close, and WAL mode.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from akrelay.store.sqlite import SqliteStore
from store_contract import StoreContract, assert_log_matches, corpus

ROOT = Path(__file__).resolve().parents[2]


class _SqliteContract(StoreContract):
    """The contract over one ``SqliteStore`` class (each variant sets ``store_class``)."""

    durable = True
    store_class: type = SqliteStore

    @pytest.fixture
    def make_store(self, tmp_path: Path):
        path = tmp_path / "relay.sqlite3"
        return lambda: self.store_class(path)

    @pytest.fixture
    def new_store(self, tmp_path: Path):
        counter = itertools.count()
        return lambda: self.store_class(tmp_path / f"fresh-{next(counter)}.sqlite3")


class _FullyIndexed(SqliteStore):
    """Every commit is followed by a full text-index catch-up: the trigram path."""

    probe_window = 3  # so that the small corpus reaches the trigram index
    density_window = 4  # and driver choice sees sparse (even empty) leading windows

    def commit(self, envelope, accepted_at):  # noqa: ANN001, ANN201
        out = super().commit(envelope, accepted_at)
        self.index_text()
        return out


class _HalfIndexed(SqliteStore):
    """The text index trails the log by about half: probe, trigram middle, scanned tail."""

    probe_window = 5
    density_window = 9

    def commit(self, envelope, accepted_at):  # noqa: ANN001, ANN201
        out = super().commit(envelope, accepted_at)
        if out[0].seq % 2 == 0:
            self.index_text(1)
        return out


class TestSqliteFullyIndexed(_SqliteContract):
    store_class = _FullyIndexed


class TestSqliteHalfIndexed(_SqliteContract):
    store_class = _HalfIndexed


def test_background_text_indexer_catches_up(tmp_path: Path) -> None:
    from akrelay.protocol.query import QueryRequest, query_matches
    from store_contract import run_query

    store = SqliteStore(tmp_path / "relay.sqlite3", text_indexer=True, indexer_interval=0.02)
    store.start()  # opening starts no thread (only start() starts)
    envs = corpus()
    store.commit_many([(e, 1) for e in envs])
    deadline = time.monotonic() + 60
    while store.text_index_lag() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.text_index_lag() == 0
    req = QueryRequest(q=("alpha", "beta"))
    assert [r.envelope.id for r in run_query(store, req, limit=10**6)] == [e.id for e in envs if query_matches(e, req)]
    store.close()
    assert store.index_text is not None


def test_wal_mode_and_reopen_keeps_records(tmp_path: Path) -> None:
    path = tmp_path / "relay.sqlite3"
    store = SqliteStore(path)
    envs = corpus()[:3]
    for env in envs:
        store.commit(env, 7)
    store.set_withheld(envs[0].id, True)
    store.close()
    assert (tmp_path / "relay.sqlite3").is_file()
    store = SqliteStore(path)
    assert store.checkpoint() == 3
    assert store.get(envs[0].id).withheld is True
    assert [r.envelope.id for r in store.iter_records(0, 10)] == [e.id for e in envs]
    import sqlite3

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    store.close()


def test_rejects_unknown_synchronous_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SqliteStore(tmp_path / "x.sqlite3", synchronous="sometimes")


def test_text_query_mixes_trigram_and_short_terms(tmp_path: Path) -> None:
    """Terms under three characters cannot use the trigram index; they must still be exact."""
    store = SqliteStore(tmp_path / "relay.sqlite3")
    envs = corpus()
    for env in envs:
        store.commit(env, 1)
    from akrelay.protocol.query import QueryRequest, query_matches
    from store_contract import run_query

    for q in (("ab",), ("ab", "alpha"), ("语",), ("zz", "ω"), ("e\u0301",), ("a\x00b",), ("alpha", "a\x00")):
        req = QueryRequest(q=q)
        got = [r.envelope.id for r in run_query(store, req, limit=10**6)]
        assert got == [e.id for e in envs if query_matches(e, req)], q
    store.close()


CHILD = r"""
import json, sys
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.store.sqlite import SqliteStore
path, items = sys.argv[1], json.load(open(sys.argv[2]))
store = SqliteStore(path)
out = []
for signed in items:
    env = Envelope(id=signed["hash"], event=signed["event"], signature=signed["signature"], event_jcs=canonicalize(signed["event"]))
    record, created = store.commit(env, 5)
    out.append([env.id, record.seq, created])
store.close()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_several_processes_share_one_file_without_duplicate_seqs(tmp_path: Path) -> None:
    path = tmp_path / "relay.sqlite3"
    SqliteStore(path).close()  # schema exists before the race, as `akrelay serve` does
    envs = list(corpus()) + list(corpus(seed=11))
    signed = [e.to_dict() for e in envs]
    procs = []
    for i in range(4):
        # overlapping halves: every envelope is committed by two processes
        part = signed[i::2]
        src = tmp_path / f"part{i}.json"
        src.write_text(json.dumps(part))
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(src)], stdout=subprocess.PIPE,
                                      env={**os.environ, "PYTHONPATH": str(ROOT / "src")}))
    outputs = []
    for p in procs:
        stdout, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        outputs.extend(json.loads(stdout))
    created = {eid: seq for eid, seq, was_created in outputs if was_created}
    assert len(created) == len(envs)
    assert sorted(created.values()) == list(range(1, len(envs) + 1))
    assert all(created[eid] == seq for eid, seq, _ in outputs)
    store = SqliteStore(path)
    assert store.checkpoint() == len(envs)
    assert [r.seq for r in store.iter_records(0, 10**6)] == list(range(1, len(envs) + 1))
    assert_log_matches(store)  # one Merkle log however the processes interleaved
    store.close()


def test_backup_and_raise_high_water_mark(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "relay.sqlite3")
    envs = corpus()[:4]
    for env in envs[:3]:
        store.commit(env, 1)
    store.meta_set("k", b"v")
    assert store.backup(tmp_path / "backup.sqlite3") == 3
    store.commit(envs[3], 2)
    store.close()
    restored = SqliteStore(tmp_path / "backup.sqlite3")
    assert restored.checkpoint() == 3 and restored.get(envs[3].id) is None
    assert restored.meta_get("k") == b"v"
    assert restored.raise_high_water_mark(4) == 4
    assert restored.raise_high_water_mark(2) == 4  # never lowered
    record, created = restored.commit(envs[3], 3)
    assert created and record.seq == 5  # 4 was issued before the backup was restored
    restored.close()


def test_probe_high_water_mark_reads_only_akrelay_stores(tmp_path) -> None:
    from akrelay.store.sqlite import SqliteStore

    assert SqliteStore.probe_high_water_mark(tmp_path / "absent.sqlite3") is None
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database at all" * 100)
    assert SqliteStore.probe_high_water_mark(junk) is None
    store = SqliteStore(tmp_path / "relay.sqlite3")
    try:
        assert store.raise_high_water_mark(41) == 41
    finally:
        store.close()
    assert SqliteStore.probe_high_water_mark(tmp_path / "relay.sqlite3") == 41


class _BackgroundCheckpoint(SqliteStore):
    """WAL checkpoints come only from the background thread, often, with an early restart."""

    WAL_RESTART_FRAMES = 64

    def __init__(self, path, **kwargs):  # noqa: ANN001, ANN003
        super().__init__(path, background_checkpoint=True, checkpoint_interval=0.005, **kwargs)
        self.start()


class TestSqliteBackgroundCheckpoint(_SqliteContract):
    store_class = _BackgroundCheckpoint


def test_writers_of_one_file_queue_on_the_write_flock(tmp_path: Path) -> None:
    """A second writer (another process in production) waits on the flock, not in SQLite's busy sleep."""
    import threading

    path = tmp_path / "relay.sqlite3"
    first, second = SqliteStore(path), SqliteStore(path)  # two open file descriptions, as two processes have
    env = corpus()[0]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with first._write_lock:  # noqa: SLF001 - the test holds the commit point on purpose
            first._locked(lambda: (holding.set(), release.wait(120)))  # noqa: SLF001

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    done: list = []
    writer = threading.Thread(target=lambda: done.append(second.commit(env, 9)))
    writer.start()
    writer.join(0.3)
    assert writer.is_alive() and not done, "the second writer must wait for the flock"
    release.set()
    holder.join(60)
    writer.join(60)
    assert done and done[0][0].seq == 1 and done[0][1] is True
    assert first.get(env.id).seq == 1
    first.close()
    second.close()


def test_background_checkpoint_moves_the_wal_into_the_database(tmp_path: Path) -> None:
    import shutil
    import sqlite3

    path = tmp_path / "relay.sqlite3"
    store = SqliteStore(path, background_checkpoint=True, checkpoint_interval=0.01)
    store.start()
    assert store._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # noqa: SLF001
    envs = corpus()
    store.commit_many([(e, 1) for e in envs])
    copy = tmp_path / "db-only.sqlite3"
    deadline = time.monotonic() + 60
    count = 0
    while time.monotonic() < deadline:  # the database file alone (no -wal) holds the records once checkpointed
        time.sleep(0.05)
        shutil.copyfile(path, copy)
        conn = sqlite3.connect(copy)
        try:
            count = conn.execute("SELECT count(*) FROM records").fetchone()[0]
        except sqlite3.Error:
            count = 0
        finally:
            conn.close()
        if count == len(envs):
            break
    assert count == len(envs)
    store.close()


class _CheckpointTicks(threading.Event):
    """The store's stop event, counting the checkpointer's waits (its timeout is the checkpoint interval)."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval, self.ticks, self.changed = interval, 0, threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        stopped = super().wait(timeout)
        if timeout == self.interval:
            with self.changed:
                self.ticks += 1
                self.changed.notify_all()
        return stopped

    def next_tick(self, limit: float = 2.0) -> None:
        with self.changed:
            seen = self.ticks
            self.changed.wait_for(lambda: self.ticks > seen + 1, timeout=limit)


def test_background_checkpoint_bounds_the_wal_under_steady_writes(tmp_path: Path) -> None:
    """Steady writes: the checkpointer gets its tick between groups, as it does between HTTP submissions.

    Each group waits for one whole checkpointer pass, so the result does not depend on
    how a loaded machine schedules the two threads.
    """
    envs = [e for seed in range(20, 60) for e in corpus(seed=seed)]

    def wal_bytes(store: SqliteStore) -> int:
        ticks = None
        if isinstance(store, _BackgroundCheckpoint):
            ticks = store._stop = _CheckpointTicks(store._checkpoint_interval)  # noqa: SLF001
        for start in range(0, len(envs), 4):  # steady small groups, as concurrent HTTP submissions give
            store.commit_many([(e, 1) for e in envs[start : start + 4]])
            if ticks is not None:
                ticks.next_tick()
        assert store.checkpoint() == len({e.id for e in envs})
        size = Path(f"{store.path}-wal").stat().st_size
        store.close()
        return size

    unchecked = SqliteStore(tmp_path / "unchecked.sqlite3")
    unchecked._writer.execute("PRAGMA wal_autocheckpoint = 0")  # noqa: SLF001 - the baseline: no checkpoints at all
    baseline = wal_bytes(unchecked)
    bounded = wal_bytes(_BackgroundCheckpoint(tmp_path / "relay.sqlite3"))
    # The WAL file keeps its largest extent; with no checkpoint it holds every frame ever written.
    assert bounded < baseline / 3, (bounded, baseline)


def test_try_commit_many_never_waits_for_a_writer_outside_the_flock(tmp_path: Path) -> None:
    """A foreign writer (the sqlite3 shell, say) holds SQLite's write lock: give up at once, change nothing."""
    import sqlite3

    path = tmp_path / "relay.sqlite3"
    store = SqliteStore(path, busy_timeout_ms=5000)
    env = corpus()[0]
    foreign = sqlite3.connect(path, isolation_level=None)
    foreign.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    assert store.try_commit_many([(env, 3)]) is None
    assert time.monotonic() - started < 1.0  # not the 5 s busy timeout
    foreign.execute("ROLLBACK")
    foreign.close()
    assert store.get(env.id) is None and store.checkpoint() == 0
    # The busy timeout is back for ordinary commits, and the store still works.
    assert store._writer.execute("PRAGMA busy_timeout").fetchone()[0] == 5000  # noqa: SLF001
    out = store.try_commit_many([(env, 3)])
    assert out is not None and out[0][0].seq == 1 and out[0][1] is True
    store.close()


def test_try_commit_many_releases_the_write_flock_when_the_write_fails(tmp_path: Path) -> None:
    path = tmp_path / "relay.sqlite3"
    store, other = SqliteStore(path), SqliteStore(path)

    def broken(conn, group):  # noqa: ANN001, ANN202
        raise RuntimeError("disk on fire")

    store._write_group = broken  # type: ignore[method-assign]  # noqa: SLF001
    with pytest.raises(RuntimeError):
        store.try_commit_many([(corpus()[0], 1)])
    # Another writer (another worker in production) is not locked out.
    out = other.try_commit_many([(corpus()[1], 1)])
    assert out is not None and out[0][0].seq == 1
    assert store._writer.execute("PRAGMA busy_timeout").fetchone()[0] == 30000  # noqa: SLF001
    store.close()
    other.close()


def test_a_reader_pinning_the_wal_does_not_stall_writers_behind_the_restart(tmp_path: Path) -> None:
    """RESTART waits for readers of old frames while holding the write flock: it must give up quickly."""
    import sqlite3

    path = tmp_path / "relay.sqlite3"
    store = _BackgroundCheckpoint(path)
    envs = [e for seed in range(20, 30) for e in corpus(seed=seed)]
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM records").fetchone()  # pins a snapshot: the WAL cannot restart
    worst = 0.0
    for start in range(0, len(envs), 4):
        began = time.monotonic()
        store.commit_many([(e, 1) for e in envs[start : start + 4]])
        worst = max(worst, time.monotonic() - began)
        time.sleep(0.005)  # let the checkpointer tick between groups
    reader.execute("COMMIT")
    reader.close()
    assert store.checkpoint() == len({e.id for e in envs})
    assert worst < 10.0, worst  # not the 30 s busy timeout (room for a loaded machine's fsyncs)
    store.close()
