"""The SQLite store's background work: the trigram text index follower and the WAL checkpointer.

Both run off the commit path on threads the store starts and stops on close (the indexer is the shared
:class:`~akrelay.store.text_indexer.TextIndexer` follower over :meth:`BackgroundWork.index_text`);
this mixin holds what they do, :class:`akrelay.store.sqlite.SqliteStore` the
threads, locks and connections they use.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar, cast

from akrelay.store.sqlite_planner import text_position
from akrelay.store.text_indexer import TextIndexer

T = TypeVar("T")


class BackgroundWork:
    """Mixin of :class:`~akrelay.store.sqlite.SqliteStore`: text indexing and WAL checkpoints."""

    path: Path
    _stop: threading.Event
    _write_lock: threading.Lock
    _closed: bool
    _indexer_interval: float
    _checkpoint_interval: float

    if TYPE_CHECKING:  # provided by SqliteStore
        def _reader(self) -> sqlite3.Connection: ...
        def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
        def _locked(self, fn: Callable[[], T]) -> T: ...
        def checkpoint(self) -> int: ...

    # -- the trigram text index, a follower of the log ------------------------------

    def text_index_lag(self) -> int:
        """Committed records not yet in the trigram index (queries scan those exactly)."""
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            position = text_position(conn)
            return cast("int", conn.execute("SELECT count(*) FROM records WHERE seq > ?", (position,)).fetchone()[0])
        finally:
            conn.execute("COMMIT")

    def index_text(self, max_records: int = 500) -> int:
        """Add up to ``max_records`` committed records to the trigram index; return how many.

        Trigram indexing costs about a millisecond per kilobyte of text, several
        times the rest of an acceptance, so it is kept off the commit path: a
        background thread (``text_indexer=True``) or a caller catches up here.
        """

        def run(c: sqlite3.Connection) -> int:
            position = text_position(c)
            rows = c.execute(
                "SELECT seq, text FROM records WHERE seq > ? ORDER BY seq LIMIT ?", (position, max_records)
            ).fetchall()
            if not rows:
                return 0
            c.executemany("INSERT INTO text_index (rowid, text) VALUES (?, ?)", rows)
            c.execute("UPDATE followers SET position = ? WHERE name = 'text_index'", (rows[-1][0],))
            return len(rows)

        return self._write(run)

    def text_index_position(self) -> int:
        """The last ``seq`` in the trigram index, as committed."""
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            return text_position(conn)
        finally:
            conn.execute("COMMIT")

    def text_indexer(self) -> TextIndexer:
        """The follower that keeps the trigram index caught up (built here, started by the caller).

        While the log grows ("quiet" is judged on the shared checkpoint) it takes 8
        records a tick, so a worker does not hold the write lock for long while
        another worker of the same relay is ingesting; 100 a step while it is still.
        """
        return TextIndexer(self, thread_name="akrelay-text-index", interval=self._indexer_interval, batch=100,
                           busy_batch=8, busy_pace=self._indexer_interval)

    #: WAL frames (pages) past which the checkpointer stops writers briefly to
    #: reset the WAL: passive checkpoints alone cannot bound it under steady writes.
    WAL_RESTART_FRAMES = 32768
    #: Seconds before another RESTART once one found readers in the way.
    RESTART_BACKOFF = 5.0

    def _run_checkpointer(self) -> None:
        """Copy WAL frames into the database while writers go on (``PASSIVE``).

        Passive checkpoints never wait for writers or readers; when the WAL still
        grows past :data:`WAL_RESTART_FRAMES` (writes never paused long enough for
        a full copy), one ``RESTART`` checkpoint under the write flock lets the
        next writer start the WAL from the beginning.
        """
        # RESTART waits for readers of old WAL frames (an online backup, a long
        # query) while every writer waits on the flock: give up after 50 ms and
        # try again on a later tick instead.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0.05)
        next_restart = 0.0
        try:
            while not self._stop.wait(self._checkpoint_interval):
                try:
                    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    # Only when everything is copied (no reader pins older frames), and
                    # not again soon after a RESTART that found readers in the way.
                    if frames > self.WAL_RESTART_FRAMES and copied == frames and time.monotonic() >= next_restart:
                        with self._write_lock:
                            if self._closed:
                                return
                            restarted = self._locked(lambda: conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone())
                        if restarted[0]:
                            next_restart = time.monotonic() + self.RESTART_BACKOFF
                except sqlite3.Error:  # pragma: no cover - retried on the next tick
                    continue
        finally:
            conn.close()
