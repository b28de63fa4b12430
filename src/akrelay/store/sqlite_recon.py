"""The reconciliation index in ``relay.sqlite3`` (schema version 3; layout in :mod:`akrelay.store.recon`).

Why tables and not a cache: the index is kept in the same transaction as the commit,
the withholding or the removal that changes the set, so every worker process sees it
current and a restart costs nothing. Ids sums are stored as eight 32-bit limbs because
SQLite adds 64-bit integers only; a limb sum stays exact up to 2^31 records per bucket.
"""

from __future__ import annotations

import sqlite3
from array import array
from contextlib import AbstractContextManager, contextmanager
from typing import Callable, Iterable, Iterator, Sequence

from akrelay.protocol.reconcile import Item
from akrelay.store.base import event_hash_bytes
from akrelay.store.recon import LIMBS, bucket_deltas, from_limbs, to_limbs

_LIMB_COLUMNS = ", ".join(f"s{i}" for i in range(LIMBS))

SCHEMA_V3 = f"""
CREATE TABLE IF NOT EXISTS recon_items (
    created_at INTEGER NOT NULL,
    hash BLOB NOT NULL,  -- the 32 raw bytes of the event hash
    PRIMARY KEY (created_at, hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS recon_buckets (
    shift INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    n INTEGER NOT NULL,
    {", ".join(f"s{i} INTEGER NOT NULL" for i in range(LIMBS))},
    PRIMARY KEY (shift, bucket)
) WITHOUT ROWID;
"""

_UPSERT = (
    f"INSERT INTO recon_buckets (shift, bucket, n, {_LIMB_COLUMNS}) VALUES (?, ?, ?, {', '.join('?' * LIMBS)}) "
    f"ON CONFLICT (shift, bucket) DO UPDATE SET n = n + excluded.n, "
    + ", ".join(f"s{i} = s{i} + excluded.s{i}" for i in range(LIMBS))
)


def migrate_v3(conn: sqlite3.Connection) -> None:
    """Create the index and back-fill it from the fetchable records, inside the migration's transaction."""
    for statement in SCHEMA_V3.split(";"):
        if statement.strip():
            conn.execute(statement)
    batch: list[Item] = []
    for created_at, event_id in conn.execute("SELECT created_at, id FROM records WHERE withheld = 0"):
        batch.append((created_at, event_hash_bytes(event_id)))
        if len(batch) >= 20000:
            recon_add(conn, batch)
            batch = []
    recon_add(conn, batch)


def _apply(conn: sqlite3.Connection, items: list[Item], sign: int) -> None:
    if not items:
        return
    rows = []
    for (shift, bucket), (n, total) in bucket_deltas(items, sign).items():
        limbs = to_limbs(abs(total))
        rows.append((shift, bucket, n, *(v if total >= 0 else -v for v in limbs)))
    conn.executemany(_UPSERT, rows)
    if sign < 0:
        conn.executemany("DELETE FROM recon_buckets WHERE shift = ? AND bucket = ? AND n = 0",
                         [r[:2] for r in rows])


def recon_add(conn: sqlite3.Connection, items: Iterable[Item]) -> None:
    """Add ``items`` (those not yet there) inside the open transaction."""
    fresh = []
    for ts, ident in items:
        if conn.execute("INSERT OR IGNORE INTO recon_items (created_at, hash) VALUES (?, ?)", (ts, ident)).rowcount:
            fresh.append((ts, ident))
    _apply(conn, fresh, 1)


def recon_discard(conn: sqlite3.Connection, items: Iterable[Item]) -> None:
    """Remove ``items`` (those there) inside the open transaction."""
    gone = []
    for ts, ident in items:
        if conn.execute("DELETE FROM recon_items WHERE created_at = ? AND hash = ?", (ts, ident)).rowcount:
            gone.append((ts, ident))
    _apply(conn, gone, -1)


def record_item(conn: sqlite3.Connection, event_id: str) -> Item | None:
    """The index item of a stored record (``None`` if not retained)."""
    row = conn.execute("SELECT created_at FROM records WHERE id = ?", (event_id,)).fetchone()
    return None if row is None else (row[0], event_hash_bytes(event_id))


def _timestamps(text: str) -> array[int]:
    """Comma-separated integers as an ``array("Q")``, parsed about a megabyte at a time (a bounded transient list)."""
    out = array("Q")
    start, end_of_text = 0, len(text)
    while start < end_of_text:
        end = text.find(",", start + (1 << 20))
        if end < 0:
            end = end_of_text
        out.extend(map(int, text[start:end].split(",")))
        start = end + 1
    return out


class SqliteReconIndex:
    """:class:`akrelay.store.recon.ReconIndex` over a reader connection; a snapshot is one read transaction."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect

    def recon_snapshot(self) -> AbstractContextManager[None]:
        @contextmanager
        def snapshot() -> Iterator[None]:
            conn = self._connect()
            if conn.in_transaction:  # nested: the outer snapshot holds
                yield
                return
            conn.execute("BEGIN")
            try:
                yield
            finally:
                conn.execute("COMMIT")

        return snapshot()

    def recon_buckets(self, shift: int, lo: int, hi: int | None) -> list[tuple[int, int, int]]:
        sql = f"SELECT bucket, n, {_LIMB_COLUMNS} FROM recon_buckets WHERE shift = ? AND bucket >= ?"
        args: tuple[int, ...] = (shift, lo)
        if hi is not None:
            sql += " AND bucket < ?"
            args += (hi,)
        rows = self._connect().execute(sql + " ORDER BY bucket", args).fetchall()
        return [(r[0], r[1], from_limbs(r[2:])) for r in rows]

    def recon_counts(self, shift: int, lo: int, hi: int) -> list[tuple[int, int]]:
        return self._connect().execute(
            "SELECT bucket, n FROM recon_buckets WHERE shift = ? AND bucket >= ? AND bucket < ? ORDER BY bucket",
            (shift, lo, hi)).fetchall()

    def recon_sum(self, shift: int, lo: int, hi: int) -> tuple[int, int]:
        row = self._connect().execute(
            f"SELECT COALESCE(SUM(n), 0), {', '.join(f'COALESCE(SUM(s{i}), 0)' for i in range(LIMBS))} "
            "FROM recon_buckets WHERE shift = ? AND bucket >= ? AND bucket < ?", (shift, lo, hi)).fetchone()
        return row[0], from_limbs(row[1:])

    def recon_sums(self, spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
        """All the spans' sums in one statement (a ``UNION ALL`` of one aggregate per span)."""
        if not spans:
            return []
        part = (f"SELECT ? AS k, COALESCE(SUM(n), 0), {', '.join(f'COALESCE(SUM(s{i}), 0)' for i in range(LIMBS))} "
                "FROM recon_buckets WHERE shift = ? AND bucket >= ? AND bucket < ?")
        args: list[int] = []
        for k, span in enumerate(spans):
            args += (k, *span)
        rows = self._connect().execute(" UNION ALL ".join([part] * len(spans)), args).fetchall()
        out = [(0, 0)] * len(spans)
        for row in rows:
            out[row[0]] = (row[1], from_limbs(row[2:]))
        return out

    def recon_columns(self, since: int | None, until: int | None) -> tuple[array[int], bytes]:
        """The items with ``since <= created_at < until`` as two columns: their timestamps and their ids, joined.

        Why: a copy of the set read as rows costs a tuple, an int and a bytes object per item
        (1.6 s at 1M); aggregated by SQLite into one text and one blob it costs 0.5 s, and the
        timestamps are parsed in C. The order is the table's key order (checked by the copy,
        which reads rows instead if it is not).
        """
        sql = "SELECT group_concat(created_at), CAST(group_concat(hash, '') AS BLOB) FROM recon_items"
        where, args = [], []
        if since is not None:
            where.append("created_at >= ?")
            args.append(since)
        if until is not None:
            where.append("created_at < ?")
            args.append(until)
        if where:
            sql += " WHERE " + " AND ".join(where)
        times, ids = self._connect().execute(sql, args).fetchone()
        if times is None:
            return array("Q"), b""
        return _timestamps(times), ids

    def recon_news(self, after_seq: int, limit: int) -> list[tuple[int, Item | None]]:
        """``(seq, item or None when withheld)`` of up to ``limit`` records after ``after_seq``: what a kept copy
        takes in (:mod:`akrelay.store.recon_copy`), read from the records' own columns, no envelope parsed."""
        rows = self._connect().execute("SELECT seq, created_at, id, withheld FROM records WHERE seq > ? "
                                       "ORDER BY seq LIMIT ?", (after_seq, limit)).fetchall()
        return [(seq, None if withheld else (created_at, event_hash_bytes(event_id)))
                for seq, created_at, event_id, withheld in rows]

    def recon_items(self, lo: Item, hi: Item | None, limit: int) -> list[Item]:
        sql = "SELECT created_at, hash FROM recon_items WHERE (created_at, hash) >= (?, ?)"
        args: tuple[object, ...] = lo
        if hi is not None:
            sql += " AND (created_at, hash) < (?, ?)"
            args += hi
        # sqlite3 gives an INTEGER as int and a BLOB as bytes: its row tuples are items as they are
        rows: list[Item] = self._connect().execute(sql + " ORDER BY created_at, hash LIMIT ?",
                                                   (*args, limit)).fetchall()
        return rows

