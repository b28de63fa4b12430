"""The layout of ``relay.sqlite3`` and its schema versions (see :mod:`akrelay.store.schema`)."""

from __future__ import annotations

import sqlite3

from akrelay.store.schema import Schema, script
from akrelay.store.sqlite_recon import migrate_v3
from akrelay.store.tlog import STRIDE

#: Version 1 is the layout before files were versioned; add a step to ``SCHEMA.migrations`` for each change.
_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    accepted_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    withheld INTEGER NOT NULL DEFAULT 0,
    text TEXT NOT NULL,  -- before body: verification reads it first, mostly on the leaf page
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS terms (
    term TEXT NOT NULL,
    seq INTEGER NOT NULL,
    created_at INTEGER NOT NULL,  -- copied so time bounds filter without a record lookup
    PRIMARY KEY (term, seq)
) WITHOUT ROWID;
CREATE VIRTUAL TABLE IF NOT EXISTS text_index USING fts5(
    text, content='records', content_rowid='seq', tokenize='trigram case_sensitive 1', detail='none'
);
CREATE TABLE IF NOT EXISTS sequence (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    hwm INTEGER NOT NULL
);
INSERT OR IGNORE INTO sequence (id, hwm) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS followers (
    name TEXT PRIMARY KEY,
    position INTEGER NOT NULL
);
INSERT OR IGNORE INTO followers (name, position) VALUES ('text_index', 0);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
"""
#: Version 2 adds the Merkle log of acceptances (issue 23): one entry per record in ``seq`` order and the
#: hash of every complete subtree of two or more leaves, node ``(level, idx)``; the leaves (level 0) are
#: hashed from the entries. Existing records are back-filled when a store opens (``SqliteStore``).
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS log_entries (
    idx INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    hash BLOB NOT NULL  -- the 32 raw bytes of the event hash
);
CREATE TABLE IF NOT EXISTS log_nodes (
    level INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    hash BLOB NOT NULL,
    PRIMARY KEY (level, idx)
) WITHOUT ROWID;
"""
#: Version 3 adds the reconciliation index (issue 26, :mod:`akrelay.store.sqlite_recon`), back-filled by the migration.
#: Version 4 keeps only the levels of ``log_nodes`` that are multiples of :data:`akrelay.store.tlog.STRIDE`
#: (the others are folded on demand): the migration deletes the rest, which version 3 wrote for every level.


def migrate_v4(conn: sqlite3.Connection) -> None:
    """Drop the Merkle nodes a version-4 store no longer keeps (the tree is unchanged: they are recomputed)."""
    conn.execute("DELETE FROM log_nodes WHERE level % ? != 0", (STRIDE,))


SCHEMA = Schema("relay store", {0: script(_SCHEMA_V1), 1: script(_SCHEMA_V2), 2: migrate_v3, 3: migrate_v4})
