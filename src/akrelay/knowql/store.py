"""Sessions, queries and query events, shared by every worker of a relay.

:class:`TurnStore` is the interface the rest of KnowQL uses; :class:`SqliteTurnStore`
keeps it in ``<data>/knowql.sqlite3`` (WAL, so a poll, a cancel or an event
replay can reach any worker), or in memory for a relay without a data
directory. :class:`akrelay.knowql.redis_store.RedisTurnStore` keeps it in Redis
for a deployment of several nodes (``--store redis://...``);
:func:`akrelay.knowql.engine.open_turn_store` picks the one the settings name.

Every status change is a compare-and-set from ``in_progress`` (a cancel and a
completion cannot both win) made in one transaction with the terminal event
and the release of the session's in-flight slot, so a session can never stay
wedged and a stream always ends with exactly one terminal event. A turn whose
deadline has passed is failed by whoever reads it next (a dead worker cannot
leave it running forever).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar

from akrelay.knowql import lifecycle
from akrelay.knowql.documents import Event, NewSession, QueryDoc, QueryFields, SessionDoc
from akrelay.knowql.errors import conflict, not_found
from akrelay.knowql.lifecycle import TERMINAL, dump as _dump, public, rfc3339
from akrelay.knowql.wakeup import Wakeups
from akrelay.store.schema import Schema, ensure_schema, script

_T = TypeVar("_T")

FILE_NAME = "knowql.sqlite3"
__all__ = ["FILE_NAME", "SCHEMA", "TERMINAL", "SqliteTurnStore", "TurnStore", "public", "rfc3339"]

#: Version 1 is the layout before files were versioned; add a step to ``SCHEMA.migrations`` for each change.
_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY, doc TEXT NOT NULL, last_query_id TEXT, inflight TEXT,
  created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queries (
  id TEXT PRIMARY KEY, session_id TEXT NOT NULL, position INTEGER NOT NULL, status TEXT NOT NULL,
  deadline REAL NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS queries_session ON queries (session_id, position);
CREATE TABLE IF NOT EXISTS query_events (
  query_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
  PRIMARY KEY (query_id, seq));
"""
SCHEMA = Schema("KnowQL turn store", {0: script(_SCHEMA_V1)})


class TurnStore(Protocol):
    """What KnowQL needs from a shared store (SQLite file, or Redis for a deployment)."""

    def create_turn(self, session: NewSession | None, session_id: str, query: QueryDoc,
                    deadline: float) -> tuple[SessionDoc, QueryDoc]: ...
    def get_query(self, query_id: str) -> QueryDoc | None: ...
    def get_session(self, session_id: str) -> SessionDoc | None: ...
    def session_queries(self, session_id: str) -> list[QueryDoc]: ...
    def recent_queries(self, session_id: str, limit: int) -> list[QueryDoc]: ...
    def session_page(self, session_id: str, offset: int, limit: int) -> tuple[int, list[QueryDoc]]: ...
    def delete_session(self, session_id: str) -> bool: ...
    def append_events(self, query_id: str, events: Sequence[Event]) -> int | None: ...
    def finish(self, query_id: str, status: str, fields: QueryFields, event: Event | None = None,
               *, pending: Sequence[Event] = ()) -> bool: ...
    def events(self, query_id: str, from_seq: int = 0) -> list[tuple[int, str, Event]]: ...
    def session_of_query(self, query_id: str) -> str | None: ...
    def status_counts(self) -> dict[str, int]: ...
    def in_progress(self, limit: int) -> list[QueryDoc]: ...
    def close(self) -> None: ...



class SqliteTurnStore:
    """:class:`TurnStore` over one SQLite file (``path``) or memory (``None``)."""

    def __init__(self, path: str | Path | None, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path) if path is not None else None
        self.clock = clock
        target = str(self.path) if self.path is not None else ":memory:"
        self._db = sqlite3.connect(target, timeout=10.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        #: tails of this process wake on every change this process commits
        self.wakeups = Wakeups()
        with self._lock:
            self._db.execute("PRAGMA busy_timeout=10000")
            if self.path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                ensure_schema(self._db, SCHEMA, target)
            except BaseException:
                self._db.close()
                raise

    @classmethod
    def in_data_dir(cls, data_dir: str | Path | None) -> "SqliteTurnStore":
        return cls(Path(data_dir) / FILE_NAME if data_dir is not None else None)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- transactions ---------------------------------------------------------------------

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result

    def _read(self, sql: str, args: tuple[str | int, ...]) -> list[tuple[Any, ...]]:  # Any: the columns its SELECT names
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- turns ------------------------------------------------------------------------------

    def create_turn(self, session: NewSession | None, session_id: str, query: QueryDoc,
                    deadline: float) -> tuple[SessionDoc, QueryDoc]:
        """Insert ``query`` (in_progress) into a new ``session`` or the existing ``session_id``.

        Takes the session's in-flight slot (409 ``session_busy`` if another turn
        holds it) and links the query after the session's last one. Nothing is
        written when it refuses.
        """
        now = self.clock()
        self._expire_session(session_id, now)

        def tx(db: sqlite3.Connection) -> tuple[SessionDoc, QueryDoc]:
            stamp = rfc3339(now)
            if session is not None:
                db.execute("INSERT INTO sessions (id, doc, last_query_id, inflight, created_at, updated_at) "
                           "VALUES (?, ?, NULL, NULL, ?, ?)", (session_id, _dump(session), stamp, stamp))
            row = db.execute("SELECT last_query_id, inflight FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise not_found("session_not_found", f"no session {session_id!r}")
            last, inflight = row
            if inflight is not None:
                raise conflict("session_busy", f"query {inflight} is still in progress on this session")
            doc = query.copy()
            doc["session_id"], doc["previous_query_id"] = session_id, last
            position = db.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM queries WHERE session_id = ?",
                                  (session_id,)).fetchone()[0]
            db.execute("INSERT INTO queries (id, session_id, position, status, deadline, doc) VALUES (?, ?, ?, ?, ?, ?)",
                       (doc["id"], session_id, position, "in_progress", deadline, _dump(doc)))
            db.execute("UPDATE sessions SET last_query_id = ?, inflight = ?, updated_at = ? WHERE id = ?",
                       (doc["id"], doc["id"], stamp, session_id))
            return self._session_doc(db, session_id), doc

        return self._write(tx)

    def _expire_session(self, session_id: str, now: float) -> None:
        rows = self._read("SELECT inflight FROM sessions WHERE id = ?", (session_id,))
        if rows and rows[0][0] is not None:
            self.get_query(rows[0][0], now=now)

    def in_progress(self, limit: int) -> list[QueryDoc]:
        """Up to ``limit`` stored documents of turns still ``in_progress`` (orphans are looked for at start)."""
        rows = self._read("SELECT doc FROM queries WHERE status = 'in_progress' LIMIT ?", (limit,))
        return [json.loads(doc) for (doc,) in rows]

    def status_counts(self) -> dict[str, int]:
        """Turns per status (``/metrics``): one shared count for every worker."""
        return {status: count for status, count in self._read("SELECT status, COUNT(*) FROM queries GROUP BY status", ())}

    def get_query(self, query_id: str, *, now: float | None = None) -> QueryDoc | None:
        rows = self._read("SELECT status, deadline, doc FROM queries WHERE id = ?", (query_id,))
        if not rows:
            return None
        status, deadline, doc = rows[0]
        now = self.clock() if now is None else now
        if lifecycle.expired(status, deadline, now):
            self.finish(query_id, "failed", *lifecycle.timeout(json.loads(doc)))
            return self.get_query(query_id, now=now)
        found: QueryDoc = json.loads(doc)
        return found

    def finish(self, query_id: str, status: str, fields: QueryFields, event: Event | None = None,
               *, pending: Sequence[Event] = ()) -> bool:
        """Move an in_progress query to ``status`` with ``fields`` merged into its document.

        ``pending`` progress events, then ``event`` (the terminal one,
        ``response.<status>`` by default), are appended in the same transaction.
        ``False`` when the query was no longer in progress (nothing is written).
        """
        assert status in TERMINAL
        now = self.clock()

        def tx(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT status, session_id, doc FROM queries WHERE id = ?", (query_id,)).fetchone()
            if row is None or row[0] != "in_progress":
                return False
            doc = lifecycle.finished(json.loads(row[2]), status, fields, now)
            db.execute("UPDATE queries SET status = ?, doc = ? WHERE id = ?", (status, _dump(doc), query_id))
            db.execute("UPDATE sessions SET inflight = NULL, updated_at = ? WHERE id = ? AND inflight = ?",
                       (rfc3339(now), row[1], query_id))
            for stored in lifecycle.progress_events(query_id, pending):
                self._append(db, query_id, stored)
            self._append(db, query_id, lifecycle.terminal_event(query_id, status, event, doc))
            return True

        done: bool = self._write(tx)
        if done:
            self.wakeups.notify(query_id)
        return done

    def append_events(self, query_id: str, events: Sequence[Event]) -> int | None:
        """Append progress events while the query is in progress; the last seq, or ``None`` if it ended."""
        def tx(db: sqlite3.Connection) -> int | None:
            row = db.execute("SELECT status FROM queries WHERE id = ?", (query_id,)).fetchone()
            if row is None or row[0] != "in_progress":
                return None
            seq = 0
            for stored in lifecycle.progress_events(query_id, events):
                seq = self._append(db, query_id, stored)
            return seq

        last: int | None = self._write(tx)
        if last:
            self.wakeups.notify(query_id)
        return last

    @staticmethod
    def _append(db: sqlite3.Connection, query_id: str, event: Event) -> int:
        seq: int = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM query_events WHERE query_id = ?",
                         (query_id,)).fetchone()[0]
        db.execute("INSERT INTO query_events (query_id, seq, type, data) VALUES (?, ?, ?, ?)",
                   (query_id, seq, event["type"], _dump(event)))
        return seq

    def events(self, query_id: str, from_seq: int = 0) -> list[tuple[int, str, Event]]:
        rows = self._read("SELECT seq, type, data FROM query_events WHERE query_id = ? AND seq >= ? ORDER BY seq",
                          (query_id, from_seq))
        return [(seq, kind, json.loads(data)) for seq, kind, data in rows]

    # ---- sessions ---------------------------------------------------------------------------

    def _session_doc(self, db: sqlite3.Connection, session_id: str) -> SessionDoc:
        row = db.execute("SELECT doc, last_query_id, created_at, updated_at FROM sessions WHERE id = ?",
                         (session_id,)).fetchone()
        doc: SessionDoc = json.loads(row[0])
        doc["last_query_id"], doc["created_at"], doc["updated_at"] = row[1], row[2], row[3]
        return doc

    def get_session(self, session_id: str) -> SessionDoc | None:
        with self._lock:
            exists = self._db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return self._session_doc(self._db, session_id) if exists else None

    def session_queries(self, session_id: str) -> list[QueryDoc]:
        ids = [r[0] for r in self._read("SELECT id FROM queries WHERE session_id = ? ORDER BY position",
                                        (session_id,))]
        return [q for qid in ids if (q := self.get_query(qid)) is not None]

    def recent_queries(self, session_id: str, limit: int) -> list[QueryDoc]:
        """The session's last ``limit`` queries, oldest first (one bounded read, however long the session)."""
        rows = self._read("SELECT doc FROM queries WHERE session_id = ? ORDER BY position DESC LIMIT ?",
                          (session_id, limit))
        return [json.loads(doc) for (doc,) in reversed(rows)]

    def session_page(self, session_id: str, offset: int, limit: int) -> tuple[int, list[QueryDoc]]:
        """The session's query count and ``limit`` of its queries from position ``offset`` (0-based), oldest first."""
        total = self._read("SELECT COUNT(*) FROM queries WHERE session_id = ?", (session_id,))[0][0]
        ids = [r[0] for r in self._read("SELECT id FROM queries WHERE session_id = ? ORDER BY position LIMIT ? OFFSET ?",
                                        (session_id, limit, offset))]
        return total, [q for qid in ids if (q := self.get_query(qid)) is not None]

    def session_of_query(self, query_id: str) -> str | None:
        rows = self._read("SELECT session_id FROM queries WHERE id = ?", (query_id,))
        return rows[0][0] if rows else None

    def delete_session(self, session_id: str) -> bool:
        def tx(db: sqlite3.Connection) -> bool:
            deleted = db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount
            db.execute("DELETE FROM query_events WHERE query_id IN (SELECT id FROM queries WHERE session_id = ?)",
                       (session_id,))
            db.execute("DELETE FROM queries WHERE session_id = ?", (session_id,))
            return bool(deleted)

        return self._write(tx)
