"""The SQLite store's Merkle log: back-fill of a version-1 file, rolled-back groups, other writers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from akrelay.protocol import merkle
from akrelay.store import sqlite as sqlite_mod
from akrelay.store.sqlite import SqliteStore
from store_contract import assert_log_matches, corpus


def _downgrade_to_v1(path: Path) -> None:
    """What a data directory written before the log looked like: no log tables, user_version 1."""
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE log_entries")
    conn.execute("DROP TABLE log_nodes")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def test_opening_a_version_1_file_back_fills_the_log(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    path = tmp_path / "relay.sqlite3"
    envs = list(corpus()) + list(corpus(seed=11))
    store = SqliteStore(path)
    store.commit_many([(env, 1) for env in envs])
    expected = merkle.root_hash(len(envs), store.log_nodes)
    store.close()
    _downgrade_to_v1(path)
    monkeypatch.setattr(sqlite_mod, "BACKFILL_BATCH", 7)  # several batches, each its own transaction
    seen: list[tuple[int, int]] = []
    store = SqliteStore(path, log_progress=lambda done, total: seen.append((done, total)))
    assert store.log_size() == len(envs)
    assert merkle.root_hash(len(envs), store.log_nodes) == expected
    assert seen[-1] == (len(envs), len(envs)) and len(seen) == -(-len(envs) // 7)
    store.commit(corpus(seed=12)[0], 2)
    assert_log_matches(store)
    store.close()
    again = SqliteStore(path)
    assert again.backfill_log() == 0
    again.close()


def test_a_rolled_back_group_leaves_no_entry_and_no_stale_frontier(tmp_path: Path) -> None:
    path = tmp_path / "relay.sqlite3"
    envs = corpus()
    store = SqliteStore(path)
    store.commit(envs[0], 1)
    conn = store._writer
    real = store._log_append

    def failing(c, entries):  # noqa: ANN001, ANN202
        real(c, entries)
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    store._log_append = failing  # type: ignore[method-assign]
    try:
        store.commit(envs[1], 2)
    except sqlite3.OperationalError:
        pass
    store._log_append = real  # type: ignore[method-assign]
    assert not conn.in_transaction and store.log_size() == 1 and store.checkpoint() == 1
    # another process appends the same number of entries meanwhile: the cache must not be reused
    other = SqliteStore(path)
    other.commit(envs[2], 3)
    other.close()
    store.commit(envs[3], 4)
    assert_log_matches(store)
    store.close()


def test_a_failing_back_fill_reports_its_own_error(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import pytest

    path = tmp_path / "relay.sqlite3"
    store = SqliteStore(path)
    store.commit_many([(env, 1) for env in corpus()[:3]])
    store.close()
    _downgrade_to_v1(path)

    def broken(self, conn, entries):  # noqa: ANN001, ANN202
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    monkeypatch.setattr(SqliteStore, "_log_append", broken)
    with pytest.raises(sqlite3.OperationalError, match="simulated"):
        SqliteStore(path)
    monkeypatch.undo()
    again = SqliteStore(path)  # nothing was left locked or half-written
    assert again.log_size() == 3
    again.close()
