"""Every SQLite file the relay writes carries a schema version, checked on open (issue 12).

For each file kind: a new file is stamped with the current version; an
existing unversioned file (``user_version`` 0) with the version-1 layout is
migrated (stamped) with its data intact; a newer version is refused with a
message naming the file and both versions, and the file is left as it was.
The KIP nexus has its own format check (tests/kip/test_nexus_store.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest

from akrelay.federation.state import SCHEMA as FEDERATION_SCHEMA
from akrelay.federation.state import FederationState
from akrelay.knowql.store import SCHEMA as KNOWQL_SCHEMA
from akrelay.knowql.store import SqliteTurnStore
from akrelay.store.schema import Schema, SchemaVersionError, ensure_schema, script
from akrelay.store.sqlite import SCHEMA as STORE_SCHEMA
from akrelay.store.sqlite import SqliteStore


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0]


def _set_version(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


# (name, schema, open the file, a table the version-1 layout has)
KINDS: list[tuple[str, Schema, Callable[[Path], Any], str]] = [
    ("relay.sqlite3", STORE_SCHEMA, SqliteStore, "records"),
    ("knowql.sqlite3", KNOWQL_SCHEMA, SqliteTurnStore, "sessions"),
    ("federation.sqlite3", FEDERATION_SCHEMA, FederationState, "peer_state"),
]


@pytest.mark.parametrize(("name", "schema", "opener", "table"), KINDS, ids=[k[0] for k in KINDS])
def test_new_file_is_stamped_and_reopens(tmp_path: Path, name: str, schema: Schema, opener: Any, table: str) -> None:
    path = tmp_path / name
    opener(path).close()
    assert _version(path) == schema.version >= 1
    opener(path).close()
    assert _version(path) == schema.version


@pytest.mark.parametrize(("name", "schema", "opener", "table"), KINDS, ids=[k[0] for k in KINDS])
def test_unversioned_file_with_the_layout_is_migrated(tmp_path: Path, name: str, schema: Schema, opener: Any,
                                                      table: str) -> None:
    path = tmp_path / name
    opener(path).close()
    conn = sqlite3.connect(path)
    rows_before = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    conn.execute(f"CREATE TABLE marker_{table} (x)")  # data the migration must keep
    conn.execute(f"INSERT INTO marker_{table} VALUES (42)")
    conn.commit()
    conn.execute("PRAGMA user_version = 0")
    conn.close()
    opener(path).close()
    assert _version(path) == schema.version
    with sqlite3.connect(path) as conn:
        assert conn.execute(f"SELECT x FROM marker_{table}").fetchall() == [(42,)]
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == rows_before


@pytest.mark.parametrize(("name", "schema", "opener", "table"), KINDS, ids=[k[0] for k in KINDS])
def test_newer_version_is_refused_by_name(tmp_path: Path, name: str, schema: Schema, opener: Any, table: str) -> None:
    path = tmp_path / name
    opener(path).close()
    _set_version(path, schema.version + 1)
    with pytest.raises(SchemaVersionError) as refused:
        opener(path)
    message = str(refused.value)
    assert str(path) in message
    assert f"version {schema.version + 1}" in message and f"version {schema.version} " in message
    assert _version(path) == schema.version + 1


def test_migrations_run_in_order_inside_one_transaction(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    steps = {
        0: script("CREATE TABLE t (a INTEGER);"),
        1: script("ALTER TABLE t ADD COLUMN b INTEGER DEFAULT 7;\nINSERT INTO t (a) VALUES (1);"),
    }
    conn = sqlite3.connect(path, isolation_level=None)
    assert ensure_schema(conn, Schema("test", {0: steps[0]}), path) == 0
    assert ensure_schema(conn, Schema("test", steps), path) == 1
    assert conn.execute("SELECT a, b FROM t").fetchall() == [(1, 7)]
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2

    def broken(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE u (x)")
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError):
        ensure_schema(conn, Schema("test", {**steps, 2: broken}), path)
    # the failed step left nothing behind, and the version did not move
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'u'").fetchone()[0] == 0
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    conn.close()


def test_a_registry_with_gaps_is_refused() -> None:
    with pytest.raises(ValueError, match="without gaps"):
        Schema("test", {0: script(""), 2: script("")})


def test_cli_names_the_newer_file_instead_of_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from akrelay.cli import main

    data = tmp_path / "data"
    data.mkdir()
    path = data / "relay.sqlite3"
    SqliteStore(path).close()
    _set_version(path, STORE_SCHEMA.version + 5)
    assert main(["reindex", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("akrelay: ") and str(path) in err and f"version {STORE_SCHEMA.version + 5}" in err
