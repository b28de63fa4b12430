"""Embedded SQLite store, the default backend.

One room per job: the file's layout and schema versions are in
:mod:`.sqlite_schema`, the query planner in :mod:`.sqlite_planner`, the text
index follower and WAL checkpointer in :mod:`.sqlite_background`; this module
holds connections, the group commit, backup and metadata.

Why it is shaped this way:

* **WAL, one serialized commit point.** ``seq`` is allocated inside
  ``BEGIN IMMEDIATE`` from a persisted high-water mark, so several processes on
  one data directory never share a ``seq``, a removed record's ``seq`` is never
  handed out again, and the checkpoint (the high-water mark) only ever covers
  committed rows.
* **Group commit.** Concurrent ``commit`` calls inside one process are gathered
  by whichever thread holds the write lock and written in one transaction: the
  per-transaction cost (lock, WAL append, fsync under ``synchronous=FULL``) is
  paid once per group instead of once per acceptance.
* **One queue for writers across processes.** Every write transaction runs
  under an exclusive ``flock`` on ``<file>.write-lock``, so the workers of one
  data directory take turns at once instead of meeting ``SQLITE_BUSY`` and
  sleeping in SQLite's busy handler (1, 2, 5, 10 … ms). Relay processes also
  move WAL checkpoints to a background thread (``background_checkpoint``):
  otherwise the commit that crosses the autocheckpoint threshold copies the WAL
  and fsyncs while every writer waits.
* **Durability.** ``commit`` returns only after ``COMMIT``. With WAL the frames
  are in the operating system before that, so an acknowledged acceptance
  survives ``kill -9`` under ``synchronous=NORMAL`` (the default here);
  ``synchronous=FULL`` also survives power loss at the price of an fsync per
  group.
* **Exact filtering.** Index terms live in a ``(term, seq)`` table, so every
  filtered page is an ordered index range scan; ``q`` terms of three or more
  characters find candidates in an FTS5 trigram index over the ASCII-folded
  search text, and every candidate is verified with ``instr`` on that text, so
  the result is complete and exact, never ranked or approximate.
* Records keep ``Envelope.canonical_bytes()``; reads rebuild with
  ``Envelope.from_trusted`` and responses splice the bytes back unchanged.
"""

from __future__ import annotations

import binascii
import fcntl
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar, cast

from akrelay.protocol.envelope import Envelope
from akrelay.protocol.merkle import Frontier
from akrelay.store.base import LogEntry, Queryable, QueryParams, Record, event_hash_bytes, indexed_facts
from akrelay.store.schema import ensure_schema
from akrelay.store.sqlite_background import BackgroundWork
from akrelay.store.text_indexer import TextIndexer
from akrelay.store.sqlite_guard import SeqReservation, hold_open_lock
from akrelay.store.sqlite_planner import COLUMNS, record_of, run_query, text_position
from akrelay.store.sqlite_recon import SqliteReconIndex, recon_add, recon_discard, record_item
from akrelay.store.sqlite_schema import SCHEMA
from akrelay.store.tlog import Run, append_entries, leaves_of, merged_runs, read_nodes

T = TypeVar("T")
log = logging.getLogger("akrelay.store")

#: Records the back-fill of the Merkle log adds per transaction.
BACKFILL_BATCH = 20000
#: base64url to standard base64, to decode a stored ID (an event hash) with binascii
_TO_STD = bytes.maketrans(b"-_", b"+/")


class _Pending:
    __slots__ = ("envelope", "accepted_at", "terms", "text", "result", "error")

    def __init__(self, envelope: Envelope, accepted_at: int) -> None:
        self.envelope = envelope
        self.accepted_at = accepted_at
        self.terms, self.text = indexed_facts(envelope)
        self.result: tuple[Record, bool] | None = None
        self.error: BaseException | None = None


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Another connection holds the lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    text = str(exc)
    return "locked" in text or "busy" in text


class SqliteStore(BackgroundWork, Queryable):
    """The embedded default store (one file, WAL, safe across processes)."""

    #: ``q`` pages may first scan this many ``seq`` values exactly before using the
    #: trigram index (off by default; the trigram intersection is cheap).
    probe_window = 0
    #: Term density is estimated (capped count) in this many ``seq`` values after ``after_seq``.
    density_window = 20000

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 30000,
        text_indexer: bool = False,
        indexer_interval: float = 0.25,
        background_checkpoint: bool = False,
        checkpoint_interval: float = 0.5,
        log_progress: Callable[[int, int], None] | None = None,
        merkle_log: bool = True,
    ) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA", "OFF"):
            raise ValueError(f"unknown synchronous setting {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._synchronous = synchronous.upper()
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._closed = False
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._pid = os.getpid()
        # Writers of every process on this file queue on one flock instead of
        # SQLite's busy handler, which sleeps 1, 2, 5, 10 … ms between retries:
        # a blocked flock wakes the moment the other writer commits.
        self._lock_fd = os.open(f"{self.path}.write-lock", os.O_RDWR | os.O_CREAT, 0o644)
        # held while open: `akrelay restore` refuses to replace a file someone has open (sqlite_guard)
        self._open_fd = hold_open_lock(self.path)
        self._reservation = SeqReservation(self.path)
        writer = self._connect()
        try:
            self._retry_busy(lambda: ensure_schema(writer, SCHEMA, self.path), writer)
        except BaseException:
            writer.close()
            os.close(self._lock_fd)
            os.close(self._open_fd)
            raise
        self._writer = writer
        #: the reconciliation index (issue 26), read in one transaction per message
        self.recon = SqliteReconIndex(self._reader)
        #: the Merkle log's frontier as of the last commit of this process (checked against the file each time)
        self._frontier: Frontier | None = None
        #: False only to measure the log's cost (``--no-merkle-log``): commits then leave the log behind
        self.merkle_log = merkle_log
        try:
            if merkle_log:
                self.backfill_log(log_progress)
        except BaseException:  # before any thread exists: close what is open, keep the original error
            with self._all_lock:
                conns, self._all = self._all, []
            for conn in conns:
                conn.close()
            os.close(self._lock_fd)
            self._closed = True
            raise
        self._stop = threading.Event()
        self._indexer_interval = indexer_interval
        self._indexer: TextIndexer | None = None
        self._text_indexer = text_indexer
        self._checkpoint_interval = checkpoint_interval
        self._checkpointer: threading.Thread | None = None
        self._background_checkpoint = background_checkpoint

    def start(self) -> None:
        """Start the background work asked for (trigram indexer, WAL checkpointer); idempotent.

        Called by the node's store component, first in start order: a store that is only
        opened (schema creation, the CLI) runs no thread.
        """
        with self._write_lock:
            if self._closed:
                raise RuntimeError("store is closed")
            self._stop.clear()
            if self._text_indexer and self._indexer is None:
                self._indexer = self.text_indexer()
                self._indexer.start()
            if self._background_checkpoint and self._checkpointer is None:
                # The commit that crosses SQLite's autocheckpoint threshold would copy
                # the WAL into the database and fsync it while every writer waits (tens
                # of ms); a background thread does that work off the commit path.
                self._writer.execute("PRAGMA wal_autocheckpoint = 0")
                self._checkpointer = threading.Thread(target=self._run_checkpointer, name="akrelay-checkpoint",
                                                      daemon=True)
                self._checkpointer.start()

    def stop(self) -> None:
        """Stop what :meth:`start` started (SQLite checkpoints by itself again); the store stays open."""
        self._stop.set()
        indexer, self._indexer = self._indexer, None
        if indexer is not None:
            indexer.stop()  # a step in progress finishes first, on the open store
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None and checkpointer is not threading.current_thread():
            checkpointer.join(timeout=5)
        if (indexer is not None or checkpointer is not None) and not self._closed:
            with self._write_lock:
                self._writer.execute("PRAGMA wal_autocheckpoint = 1000")

    # -- connections ---------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":  # pragma: no cover - e.g. an unsupported filesystem
            raise RuntimeError(f"SQLite refused WAL mode for {self.path} (got {mode})")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA cache_size = -65536")
        with self._all_lock:
            self._all.append(conn)
        return conn

    @staticmethod
    def _retry_busy(fn: Callable[[], T], conn: sqlite3.Connection) -> T:
        for attempt in range(50):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if attempt == 49:
                    raise
                threading.Event().wait(0.05)
        raise AssertionError("unreachable: the last attempt raises")  # pragma: no cover

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("store is closed")
        if os.getpid() != self._pid:
            raise RuntimeError("SqliteStore cannot be shared across fork(); open one per process")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only = 1")
            self._local.conn = conn
        return conn

    # -- reads -------------------------------------------------------------
    def get(self, event_id: str) -> Record | None:
        row = self._reader().execute(f"SELECT {COLUMNS} FROM records r WHERE r.id = ?", (event_id,)).fetchone()
        return record_of(row) if row else None

    def get_many(self, event_ids: Sequence[str]) -> dict[str, Record]:
        ids = list(dict.fromkeys(event_ids))
        out: dict[str, Record] = {}
        conn = self._reader()
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(f"SELECT r.id, {COLUMNS} FROM records r WHERE r.id IN ({marks})", chunk):
                out[row[0]] = record_of(row[1:])
        return out

    def checkpoint(self) -> int:
        return cast("int", self._reader().execute("SELECT hwm FROM sequence WHERE id = 1").fetchone()[0])

    def iter_records(self, after_seq: int, limit: int) -> list[Record]:
        rows = self._reader().execute(
            f"SELECT {COLUMNS} FROM records r WHERE r.seq > ? ORDER BY r.seq LIMIT ?", (after_seq, limit)
        ).fetchall()
        return [record_of(row) for row in rows]

    def select(self, params: QueryParams) -> list[Record]:
        """One exact page; the plan is :func:`akrelay.store.sqlite_planner.run_query`'s."""
        return run_query(self._reader(), params, probe_window=self.probe_window, density_window=self.density_window)

    # -- writes ------------------------------------------------------------
    def commit(self, envelope: Envelope, accepted_at: int) -> tuple[Record, bool]:
        pending = _Pending(envelope, accepted_at)
        with self._queue_lock:
            self._queue.append(pending)
        with self._write_lock:
            if pending.result is None and pending.error is None:
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._commit_group(group)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def commit_many(self, items: Iterable[tuple[Envelope, int]]) -> list[tuple[Record, bool]]:
        """Commit ``(envelope, accepted_at)`` pairs in one transaction (imports, sync, benchmarks)."""
        group = [_Pending(env, accepted_at) for env, accepted_at in items]
        with self._write_lock:
            self._commit_group(group)
        for item in group:
            if item.error is not None:
                raise item.error
        return [item.result for item in group]  # type: ignore[misc]

    def _locked(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` holding the cross-process write flock (the caller holds ``_write_lock``)."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            return fn()
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def try_commit_many(self, items: Sequence[tuple[Envelope, int]]) -> list[tuple[Record, bool]] | None:
        """:meth:`commit_many` if the commit point is free right now, else ``None`` without waiting.

        An event loop can then commit on its own thread when nobody else is
        writing (no thread hop) and hand the group to a thread only when it
        would have to wait.
        """
        group = [_Pending(env, accepted_at) for env, accepted_at in items]  # before any lock
        if not self._write_lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                raise RuntimeError("store is closed")
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            try:
                conn = self._writer
                # A writer outside the flock (an older tool, the sqlite3 shell) must not
                # make the caller's event loop sleep in the busy handler: fail at once.
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    return self._write_group(conn, group)
                except sqlite3.OperationalError as exc:
                    if _is_busy(exc):
                        return None
                    raise
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)  # whatever failed above
        finally:
            self._write_lock.release()

    def _commit_group(self, group: list[_Pending]) -> None:
        conn = self._writer
        try:
            results = self._locked(lambda: self._retry_busy(lambda: self._write_group(conn, group), conn))
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter, each of which raises it
            for item in group:
                item.error = exc
            return
        for item, result in zip(group, results):
            item.result = result

    def _write_group(self, conn: sqlite3.Connection, group: list[_Pending]) -> list[tuple[Record, bool]]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            hwm = conn.execute("SELECT hwm FROM sequence WHERE id = 1").fetchone()[0]
            fresh: dict[str, Record] = {}
            results: list[tuple[Record, bool]] = []
            term_rows: list[tuple[str, int, int]] = []
            for item in group:
                env = item.envelope
                if env.id in fresh:
                    results.append((fresh[env.id], False))
                    continue
                body = env.canonical_bytes()
                created_at = env.created_at
                try:
                    # The UNIQUE id constraint is the existence check: one statement
                    # for a new record; only a duplicate pays for the lookup.
                    conn.execute(
                        "INSERT INTO records (seq, id, accepted_at, created_at, withheld, body, text) "
                        "VALUES (?, ?, ?, ?, 0, ?, ?)",
                        (hwm + 1, env.id, item.accepted_at, created_at, body, item.text),
                    )
                except sqlite3.IntegrityError:
                    row = conn.execute(f"SELECT {COLUMNS} FROM records r WHERE r.id = ?", (env.id,)).fetchone()
                    if row is None:
                        raise
                    results.append((record_of(row), False))
                    continue
                hwm += 1
                term_rows += [(t, hwm, created_at) for t in item.terms]
                record = Record(hwm, item.accepted_at, env, False, body=body)
                fresh[env.id] = record
                results.append((record, True))
            frontier = None
            if fresh:
                conn.executemany("INSERT INTO terms (term, seq, created_at) VALUES (?, ?, ?)", term_rows)
                self._reservation.cover(hwm)  # durable outside the file before any of these seqs is acknowledged
                conn.execute("UPDATE sequence SET hwm = ? WHERE id = 1", (hwm,))
            if fresh:
                recon_add(conn, [(r.envelope.created_at, event_hash_bytes(r.id)) for r in fresh.values()])
            if fresh and self.merkle_log:
                frontier = self._log_append(conn, [(r.seq, event_hash_bytes(r.id)) for r in fresh.values()])
                for index, record in enumerate(fresh.values(), frontier.size - len(fresh)):
                    record.log_index = index
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if frontier is not None:
            self._frontier = frontier  # only once committed: a rolled-back group must not leave it ahead
        return results

    # -- the Merkle log (issue 23) ------------------------------------------------------
    def _log_append(self, conn: sqlite3.Connection, entries: list[tuple[int, bytes]]) -> Frontier:
        """Append entries and their completed subtrees inside the open transaction; return the new frontier.

        The cached frontier is used only when the file's log has its size (no other
        process appended since); otherwise it is read back, O(log n) rows.
        """
        size = conn.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM log_entries").fetchone()[0]
        cached = self._frontier
        if cached is None or cached.size != size:
            try:
                frontier = Frontier.load(size, lambda keys: self._nodes_on(conn, keys))
            except KeyError as exc:
                frontier = self._rebuild_nodes(conn, f"node {exc} is missing")
        else:
            frontier = cached.copy()
        conn.executemany(
            "INSERT INTO log_entries (idx, seq, hash) VALUES (?, ?, ?)",
            [(size + i, seq, event_hash) for i, (seq, event_hash) in enumerate(entries)],
        )
        conn.executemany("INSERT INTO log_nodes (level, idx, hash) VALUES (?, ?, ?)", append_entries(frontier, entries))
        return frontier

    @staticmethod
    def _rebuild_nodes(conn: sqlite3.Connection, why: str) -> Frontier:
        """Recompute every stored node from the entries (a damaged file; O(n)). Commits must go on.

        The signer still proves each new tree consistent with its last signed
        checkpoint, so entries changed behind the store's back are reported there.
        """
        log.error("merkle log: %s; rebuilding the tree from its entries", why)
        conn.execute("DELETE FROM log_nodes")
        frontier = Frontier()
        rows = conn.execute("SELECT seq, hash FROM log_entries ORDER BY idx")
        while batch := rows.fetchmany(BACKFILL_BATCH):
            nodes = append_entries(frontier, [(seq, bytes(event_hash)) for seq, event_hash in batch])
            conn.executemany("INSERT INTO log_nodes (level, idx, hash) VALUES (?, ?, ?)", nodes)
        return frontier

    @staticmethod
    def _nodes_on(conn: sqlite3.Connection, keys: Sequence[tuple[int, int]]) -> list[bytes]:
        """Nodes from the stored levels (:mod:`akrelay.store.tlog`): one range read per node, folded."""

        def fetch(runs: Sequence[Run]) -> list[list[bytes]]:
            reads, owner = merged_runs(runs)
            got: list[list[bytes]] = []  # the hashes of each read, or none where one is missing
            for level, lo, hi in reads:
                if level == 0:
                    rows = conn.execute(
                        "SELECT seq, hash FROM log_entries WHERE idx >= ? AND idx < ? ORDER BY idx", (lo, hi)
                    ).fetchall()
                    values = leaves_of([(seq, bytes(h)) for seq, h in rows])
                else:
                    rows = conn.execute(
                        "SELECT hash FROM log_nodes WHERE level = ? AND idx >= ? AND idx < ? ORDER BY idx",
                        (level, lo, hi),
                    ).fetchall()
                    values = [bytes(row[0]) for row in rows]
                # indices are unique, so a full count is the whole range; a short one marks every run in it missing
                got.append(values if len(values) == hi - lo else [])
            out: list[list[bytes]] = []
            for (_, lo, hi), at in zip(runs, owner):
                start = reads[at][1]
                out.append(got[at][lo - start : hi - start])
            return out

        return read_nodes(keys, fetch)

    def backfill_log(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Add the records that have no log entry yet (a store written before version 2); return how many.

        Runs when the store opens, in transactions of :data:`BACKFILL_BATCH`
        records, each under the commit point, so concurrent openers share the work
        and a crash resumes where the last batch ended. ``progress(done, total)``
        is called after each batch (and logged at INFO).
        """
        first = self._reader().execute(
            "SELECT (SELECT COALESCE(MAX(seq), 0) FROM records), (SELECT COALESCE(MAX(seq), 0) FROM log_entries)"
        ).fetchone()
        if first[0] <= first[1]:
            return 0
        total = self._reader().execute("SELECT COUNT(*) FROM records WHERE seq > ?", (first[1],)).fetchone()[0]
        done = 0
        started = time.monotonic()

        def batch(c: sqlite3.Connection) -> tuple[int, Frontier | None]:
            after = c.execute("SELECT COALESCE(MAX(seq), 0) FROM log_entries").fetchone()[0]
            # the ID column (the event hash, 43 base64url characters) is decoded here in one comprehension:
            # the per-record Python work is most of a back-fill's CPU time
            rows = c.execute(
                "SELECT seq, id FROM records WHERE seq > ? ORDER BY seq LIMIT ?", (after, BACKFILL_BATCH)
            ).fetchall()
            if not rows:
                return 0, None
            unb64, std = binascii.a2b_base64, _TO_STD
            return len(rows), self._log_append(c, [(seq, unb64((eid + "=").encode().translate(std))) for seq, eid in rows])

        while True:
            added, frontier = self._write(batch)
            if not added:
                break
            self._frontier = frontier
            done += added
            rate = done / max(time.monotonic() - started, 1e-9)
            log.info("merkle log back-fill: %d of %d records (%.0f records/s)", done, total, rate)
            if progress is not None:
                progress(done, total)
        return done

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in its own immediate transaction at the commit point."""
        conn = self._writer

        def run() -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                value = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return value

        with self._write_lock:
            if self._closed:
                raise RuntimeError("store is closed")
            return self._locked(lambda: self._retry_busy(run, conn))

    def set_withheld(self, event_id: str, withheld: bool) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            if not c.execute("UPDATE records SET withheld = ? WHERE id = ?", (int(withheld), event_id)).rowcount:
                return False
            item = record_item(c, event_id)
            if item is not None:  # a withheld record is not offered to reconciling peers
                (recon_discard if withheld else recon_add)(c, [item])
            return True

        return self._write(run)

    def remove(self, event_id: str) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT seq, text FROM records WHERE id = ?", (event_id,)).fetchone()
            if row is None:
                return False
            seq, text = row
            if seq <= text_position(c):
                c.execute("INSERT INTO text_index (text_index, rowid, text) VALUES ('delete', ?, ?)", (seq, text))
            item = record_item(c, event_id)
            if item is not None:
                recon_discard(c, [item])
            c.execute("DELETE FROM terms WHERE seq = ?", (seq,))
            c.execute("DELETE FROM records WHERE seq = ?", (seq,))
            return True

        return self._write(run)

    # -- operations ----------------------------------------------------------------
    def backup(self, destination: str | os.PathLike[str]) -> int:
        """Write a consistent online snapshot to ``destination``; return its checkpoint."""
        dest = sqlite3.connect(destination)
        try:
            self._reader().backup(dest)
            return cast("int", dest.execute("SELECT hwm FROM sequence WHERE id = 1").fetchone()[0])
        finally:
            dest.close()

    @staticmethod
    def probe_high_water_mark(path: str | os.PathLike[str]) -> int | None:
        """The high-water mark of the store file at ``path``, read-only; ``None`` if
        there is no file or it is not an akrelay store (restore checks backups with it)."""
        path = Path(path)
        if not path.is_file():
            return None
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        except sqlite3.Error:
            return None
        try:
            row = conn.execute("SELECT hwm FROM sequence WHERE id = 1").fetchone()
            return int(row[0]) if row else None
        except sqlite3.DatabaseError:
            return None
        finally:
            conn.close()

    def raise_high_water_mark(self, seq: int) -> int:
        """Never hand out ``seq`` or below again (after a restore); return the new mark."""

        def run(c: sqlite3.Connection) -> int:
            c.execute("UPDATE sequence SET hwm = MAX(hwm, ?) WHERE id = 1", (int(seq),))
            mark = cast("int", c.execute("SELECT hwm FROM sequence WHERE id = 1").fetchone()[0])
            self._reservation.cover(mark)
            return mark

        return self._write(run)

    # -- metadata ------------------------------------------------------------
    def meta_get(self, key: str) -> bytes | None:
        row = self._reader().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row else None

    def meta_set(self, key: str, value: bytes) -> None:
        self._write(lambda c: c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, bytes(value))))

    def meta_setdefault(self, key: str, value: bytes) -> bytes:
        def run(c: sqlite3.Connection) -> bytes:
            c.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, bytes(value)))
            return bytes(c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])

        return self._write(run)

    def meta_replace(self, key: str, expected: bytes | None, value: bytes) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if (bytes(row[0]) if row else None) != expected:
                return False
            c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, bytes(value)))
            return True

        return self._write(run)

    # -- the Merkle log: reads -----------------------------------------------------------
    def log_size(self) -> int:
        return cast("int", self._reader().execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM log_entries").fetchone()[0])

    def log_entries(self, start: int, limit: int) -> list[LogEntry]:
        rows = self._reader().execute(
            "SELECT e.idx, e.seq, e.hash, r.withheld FROM log_entries e LEFT JOIN records r ON r.seq = e.seq "
            "WHERE e.idx >= ? ORDER BY e.idx LIMIT ?", (max(0, start), max(0, limit)),
        ).fetchall()
        return [LogEntry(i, seq, bytes(h), None if w is None else bool(w)) for i, seq, h, w in rows]

    def log_index(self, seq: int) -> int | None:
        row = self._reader().execute("SELECT idx FROM log_entries WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else int(row[0])

    def log_nodes(self, keys: Sequence[tuple[int, int]]) -> list[bytes]:
        conn = self._reader()
        conn.execute("BEGIN")  # one snapshot for the whole proof
        try:
            return self._nodes_on(conn, keys)
        finally:
            conn.execute("COMMIT")

    def ping(self) -> None:
        """One read on this thread's connection: the file is open and readable."""
        self._reader().execute("SELECT 1").fetchone()

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        if self._indexer is not None:
            self._indexer.stop()  # a step in progress finishes first, on the open store
        for thread in (self._checkpointer,):
            if thread is not None and thread is not threading.current_thread():
                with self._write_lock:  # let a step that holds the commit point finish first
                    self._closed = True
                thread.join(timeout=5)
        self._closed = True
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:  # pragma: no cover
                pass
        with self._write_lock:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            if self._open_fd >= 0:
                os.close(self._open_fd)
                self._open_fd = -1
