"""The node-local trigram index of a Redis log's search text (``q`` candidates for the Redis store).

Why node-local (docs/architecture.md, "The Redis store", weighs it against posting
sets in Redis): the trigram postings of ~1.5 KiB of text per record would cost
Redis tens of kilobytes of memory per record and thousands of writes per commit,
inside the single-threaded server every node shares. Instead each node follows
the shared log into an SQLite FTS5 trigram file in its data directory, exactly as
the SQLite store follows its own log, and the store asks it only for *candidates*:

* **A superset, verified in Redis.** Every record at or below the index's
  *position* is in the index, so an AND of a term's trigrams selects a superset
  of the records holding the term; Redis then checks each candidate exactly (its
  current text, terms, time, withheld state; a removed record is simply gone).
  Records past the position are scanned exactly in Redis, so results never
  depend on how far the index has caught up.
* **Never misread.** The file records its format, the log it follows (a random
  ID kept in the log's metadata) and a digest of the last record it took. A
  missing, corrupt or unknown-format file, another log, or a log that no longer
  holds what the index took (a restore from an older backup) is rebuilt from
  scratch with a warning; until it has caught up, queries scan. Readers check
  format and log ID in the same read transaction as the candidates, and reopen
  when the file was replaced.
* **One writer per data directory.** Granian's workers share ``--data``: the
  worker holding the ``.lock`` flock indexes, the others only read; a killed
  writer's last transaction is rolled back and it resumes from its position.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from akrelay.store.leader_lock import LeaderLock
from akrelay.store.sqlite_planner import fts_query

log = logging.getLogger("akrelay.store.redis.text")

#: The file's name in a node's data directory.
TEXT_INDEX_FILE = "redis-text.db"
#: The file layout this akrelay writes and reads; any other is rebuilt.
FORMAT = 1
#: Seconds between attempts to open a reader on a file that is not there (yet).
REOPEN_DELAY = 1.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS grams USING fts5(
    text, content='', tokenize='trigram case_sensitive 1', detail='none'
);
"""


def digest(value: bytes) -> str:
    """What the index remembers of the last record it took (its stored filter value), to notice a
    log that changed under it; SHA-1 because a Redis script can compute it too (``redis.sha1hex``)."""
    return hashlib.sha1(value).hexdigest()


def indexable(texts: Sequence[str]) -> list[str]:
    """The ``q`` terms the trigram index can narrow: three or more characters and no NUL."""
    return [t for t in texts if len(t) >= 3 and "\x00" not in t]


@dataclass(slots=True)
class Snapshot:
    """One read transaction on the index: its position, and candidates at or below it."""

    conn: sqlite3.Connection
    position: int
    #: the last record taken and the :func:`digest` of its value then (checked in Redis with every use)
    last_seq: int
    last_digest: str

    def count(self, match: str, lower: int, upper: int, cap: int) -> int:
        """Candidates in ``(lower, upper]``, counted up to ``cap``."""
        row = self.conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM grams WHERE grams MATCH ? AND rowid > ? AND rowid <= ? LIMIT ?)",
            (match, lower, upper, cap),
        ).fetchone()
        return int(row[0])

    def chunks(self, match: str, lower: int, upper: int, first: int, most: int) -> Iterator[list[int]]:
        """Candidate ``seq`` values in ``(lower, upper]``, ascending, in chunks of ``first``, doubling up to ``most``.

        A page usually fills from its first candidates: small chunks first keep
        a short page from shipping (and reading) candidates it never needs.
        """
        cursor = self.conn.execute(
            "SELECT rowid FROM grams WHERE grams MATCH ? AND rowid > ? AND rowid <= ? ORDER BY rowid",
            (match, lower, upper),
        )
        size = max(1, min(first, most))
        while rows := cursor.fetchmany(size):
            yield [row[0] for row in rows]
            size = min(size * 2, most)


class TextIndex:
    """The trigram file at ``path``, following the log whose ID is ``log_id``."""

    def __init__(self, path: str | os.PathLike[str], log_id: str) -> None:
        self.path = Path(path)
        self.log_id = log_id
        #: elects the one writing process of the data directory (the kernel drops it when that process dies)
        self.leader = LeaderLock(self.path.with_name(self.path.name + ".lock"))
        self._writer: sqlite3.Connection | None = None
        self._writer_inode = -1
        #: one writing thread at a time in this process (the leader lock is per process)
        self.write_lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._closed = False
        self._warned = False

    # -- reading (every process) -----------------------------------------------------------
    def _reader(self) -> sqlite3.Connection | None:
        """This thread's read-only connection, reopened when the file was replaced."""
        # An open connection keeps its inode alive, so a replaced file has another inode;
        # a file that failed (connection closed) is known by inode, size and mtime.
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        inode = None if st is None else st.st_ino
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "inode", None) == inode:
            return conn
        if conn is not None:
            self._drop_reader()
        if st is None:
            return None
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == getattr(self._local, "failed", None) and time.monotonic() < self._local.retry_at:
            return None  # this file failed a moment ago; a replaced file is tried at once
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error:
            self._local.failed, self._local.retry_at = signature, time.monotonic() + REOPEN_DELAY
            return None
        with self._guard:
            if self._closed:
                conn.close()
                return None
            self._readers.append(conn)
        self._local.conn, self._local.inode = conn, inode
        return conn

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _drop_reader(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        self._local.failed, self._local.retry_at = self._signature(), time.monotonic() + REOPEN_DELAY
        if conn is not None:
            with self._guard:
                if conn in self._readers:
                    self._readers.remove(conn)
            conn.close()

    def failed(self, exc: BaseException | str) -> None:
        """A read failed (``exc``) or found the index stale (a reason): warn once; drop a failed connection."""
        if not self._warned:
            self._warned = True
            log.warning("text index %s cannot be used (%s); q scans in Redis until it is rebuilt", self.path, exc)
        if not isinstance(exc, str):
            self._drop_reader()

    @contextmanager
    def snapshot(self) -> Iterator[Snapshot | None]:
        """A read transaction on an index of this format and this log, or ``None`` (then scan)."""
        conn = self._reader()
        if conn is None:
            yield None
            return
        try:
            conn.execute("BEGIN")
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error as exc:
            self.failed(exc)
            yield None
            return
        try:
            if meta.get("format") == str(FORMAT) and meta.get("log_id") == self.log_id:
                yield Snapshot(conn, int(meta["position"]), int(meta["last_seq"]), meta["last_digest"])
            else:
                yield None
        finally:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:  # pragma: no cover - the connection is dropped and reopened
                self.failed(exc)

    # -- writing (the leader of the data directory) ----------------------------------------
    def writer(self) -> sqlite3.Connection:
        """The writer connection, on a checked file of this format and log (rebuilt otherwise).

        A file deleted (or replaced) under an open writer is noticed here and recreated.
        """
        if self._writer is not None:
            signature = self._signature()
            if signature is not None and signature[0] == self._writer_inode:
                return self._writer
            log.warning("text index %s was deleted or replaced; rebuilding it from the log", self.path)
            self.discard_writer()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._open_checked()
        except sqlite3.DatabaseError as exc:
            log.warning("text index %s is unreadable (%s); deleting it and rebuilding from the log", self.path, exc)
            self._delete_files()
            conn = self._open_checked()
        self._writer, self._writer_inode = conn, os.stat(self.path).st_ino
        return conn

    def _open_checked(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5)
        try:
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("integrity check failed")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone()
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall()) if has_meta else {}
            if not meta:
                self._reset(conn, "")
            elif meta.get("format") != str(FORMAT):
                self._reset(conn, f"it has format {meta.get('format')!r} and this akrelay writes {FORMAT}")
            elif meta.get("log_id") != self.log_id:
                self._reset(conn, "it follows another acceptance log")
            return conn
        except BaseException:
            conn.close()
            raise

    def _reset(self, conn: sqlite3.Connection, why: str) -> None:
        """Empty the index in one transaction (readers see position 0: they scan until it catches up)."""
        if why:
            log.warning("text index %s: %s; rebuilding it from the log", self.path, why)
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DROP TABLE IF EXISTS grams")
            conn.execute("DROP TABLE IF EXISTS meta")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
                ("format", str(FORMAT)), ("log_id", self.log_id), ("position", "0"),
                ("last_seq", "0"), ("last_digest", ""),
            ])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _delete_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(f"{self.path}{suffix}")
            except FileNotFoundError:
                pass

    def state(self) -> tuple[int, int, str]:
        """``(position, last_seq, last_digest)`` as committed."""
        meta = dict(self.writer().execute("SELECT key, value FROM meta").fetchall())
        return int(meta["position"]), int(meta["last_seq"]), meta["last_digest"]

    def check_log(self, checkpoint: int, value_at: Callable[[int], bytes | None]) -> None:
        """Rebuild when the log no longer holds what the index took (before every step).

        ``value_at(seq)`` reads a record's stored filter value from the log
        (``None``: removed since, which proves nothing).
        """
        position, last_seq, last_digest = self.state()
        if checkpoint < position:
            self._reset(self.writer(), f"it reached seq {position} but the log ends at {checkpoint} "
                        "(restored from an older backup?)")
            return
        value = value_at(last_seq) if last_seq else None
        if value is not None and digest(value) != last_digest:
            self._reset(self.writer(), f"the log's record {last_seq} is not the one it took "
                        "(restored from an older backup?)")

    def add(self, rows: Sequence[tuple[int, bytes]], position: int) -> None:
        """Index ``rows`` (``seq``, stored ``b"<created_at> <search text>"``) and move the position, in one transaction."""
        conn = self.writer()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("INSERT INTO grams (rowid, text) VALUES (?, ?)",
                             [(seq, value[value.index(b" ") + 1:].decode("utf-8")) for seq, value in rows])
            updates = [("position", str(position))]
            if rows:
                updates += [("last_seq", str(rows[-1][0])), ("last_digest", digest(rows[-1][1]))]
            conn.executemany("UPDATE meta SET value = ? WHERE key = ?", [(v, k) for k, v in updates])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def discard_writer(self) -> None:
        """Close the writer after an error: the next :meth:`writer` checks the file again (and rebuilds it if need be)."""
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None

    def close(self) -> None:
        with self._guard:
            self._closed = True
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self.discard_writer()
        self.leader.release()


__all__ = ["FORMAT", "TEXT_INDEX_FILE", "Snapshot", "TextIndex", "digest", "fts_query", "indexable"]
