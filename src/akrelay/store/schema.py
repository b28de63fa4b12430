"""Schema versions for every SQLite file the relay writes (``PRAGMA user_version``).

Each file kind declares a :class:`Schema`: its current version and a registry
of migrations, one per step from version N to N+1. :func:`ensure_schema` runs
on every open, inside one ``BEGIN IMMEDIATE`` transaction (so concurrent
openers of the same file serialise and the second sees the first's work):

- a file at an older version is migrated step by step and stamped;
- version 1 is the layout each file had before it was versioned, and the step
  from 0 creates it with ``CREATE … IF NOT EXISTS``; so a new, empty file and an
  existing unversioned file with the version-1 layout take the same step;
- a file at a version newer than this akrelay knows is refused with
  :class:`SchemaVersionError`, naming the file and both versions, before
  its tables are touched.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Callable, Mapping

#: One migration step: runs inside the open transaction, on the file at version N, and leaves it at N+1.
Migration = Callable[[sqlite3.Connection], None]


class SchemaVersionError(RuntimeError):
    """A SQLite file this akrelay cannot read or migrate (its schema version is newer, or has no path here)."""


def script(sql: str) -> Migration:
    """A migration that runs ``sql`` (several statements; no transaction control of its own)."""

    def run(conn: sqlite3.Connection) -> None:
        for statement in _statements(sql):
            conn.execute(statement)

    return run


def _statements(sql: str) -> list[str]:
    out: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                out.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete SQL statement: {buffer.strip()[:60]!r}")
    return out


@dataclass(frozen=True)
class Schema:
    """A kind of SQLite file: what it is called in messages, and its migrations by starting version."""

    name: str
    migrations: Mapping[int, Migration] = field(default_factory=dict)

    @property
    def version(self) -> int:
        """The current version: one past the last migration."""
        return max(self.migrations, default=-1) + 1

    def __post_init__(self) -> None:
        if sorted(self.migrations) != list(range(len(self.migrations))):
            raise ValueError(f"{self.name}: migrations must be numbered 0, 1, 2, ... without gaps")


def stored_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_version(schema: Schema, version: int, path: object) -> None:
    """Refuse a file whose version is newer than ``schema``'s current one."""
    if version > schema.version:
        raise SchemaVersionError(
            f"{path}: this {schema.name} file has schema version {version}, newer than version {schema.version} "
            "that this akrelay reads; run a newer akrelay or restore a backup made by this one"
        )


def ensure_schema(conn: sqlite3.Connection, schema: Schema, path: object) -> int:
    """Bring the file open on ``conn`` (autocommit mode) to ``schema.version``; returns the version it had.

    Cheap when the file is current (a read of its header); a newer file is
    refused without a write lock being taken.
    """
    found = stored_version(conn)
    check_version(schema, found, path)
    if found == schema.version:
        return found
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = stored_version(conn)  # another opener may have migrated it meanwhile
        check_version(schema, found, path)
        for version in range(found, schema.version):
            schema.migrations[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return found
