"""The SQLite store's Merkle log: back-fill of a version-1 file, rolled-back groups, other writers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from akrelay.protocol import merkle
from akrelay.store import sqlite as sqlite_mod
from akrelay.store.sqlite import SqliteStore
from akrelay.store.sqlite_schema import SCHEMA
from akrelay.store.tlog import STRIDE, append_all_levels, leaf_of
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


def _assert_proofs_match_the_rfc(store: SqliteStore) -> None:
    """Every inclusion and consistency proof from the folded nodes equals the RFC 9162 definition's (naive)."""
    import rfc9162_naive as naive

    n = store.log_size()
    entries = [merkle.entry_bytes(e.seq, e.hash) for e in store.log_entries(0, n)]
    for i in range(n):
        assert merkle.inclusion_proof(i, n, store.log_nodes) == naive.PATH(i, entries)
    for m in range(1, n):
        assert merkle.consistency_proof(m, n, store.log_nodes) == naive.PROOF(m, entries)
        assert merkle.root_hash(m, store.log_nodes) == naive.MTH(entries[:m])


def _stored_levels(path: Path) -> set[int]:
    conn = sqlite3.connect(path)
    try:
        return {level for (level,) in conn.execute("SELECT DISTINCT level FROM log_nodes")}
    finally:
        conn.close()


def test_only_every_strideth_level_is_stored_and_the_rest_is_folded(tmp_path: Path) -> None:
    path = tmp_path / "relay.sqlite3"
    envs = list(corpus()) + list(corpus(seed=13))
    store = SqliteStore(path)
    for k in range(0, len(envs), 5):  # several commit groups, so the frontier is reused and reloaded
        store.commit_many([(env, 1) for env in envs[k : k + 5]])
    store.close()
    levels = _stored_levels(path)
    assert levels and all(level % STRIDE == 0 for level in levels)
    store = SqliteStore(path)
    assert_log_matches(store)
    _assert_proofs_match_the_rfc(store)
    store.close()


def test_a_version_3_file_with_every_level_is_migrated_and_keeps_its_tree(tmp_path: Path) -> None:
    """A data directory of the previous layout (version 3 stored a node for every level) opens unchanged."""
    path = tmp_path / "relay.sqlite3"
    envs = list(corpus()) + list(corpus(seed=14))
    store = SqliteStore(path)
    store.commit_many([(env, 1) for env in envs])
    n = store.log_size()
    entries = [(e.seq, e.hash) for e in store.log_entries(0, n)]
    store.close()
    conn = sqlite3.connect(path)  # rewrite the nodes as version 3 did: every level from 1 up
    conn.execute("DELETE FROM log_nodes")
    conn.executemany("INSERT INTO log_nodes (level, idx, hash) VALUES (?, ?, ?)",
                     append_all_levels(merkle.Frontier(), entries))
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    assert 1 in _stored_levels(path)
    expected = merkle.root_of_leaves([leaf_of(seq, h) for seq, h in entries])
    store = SqliteStore(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA.version == 4
    assert all(level % STRIDE == 0 for level in _stored_levels(path))
    assert merkle.root_hash(n, store.log_nodes) == expected
    _assert_proofs_match_the_rfc(store)
    store.commit(corpus(seed=15)[0], 2)
    assert_log_matches(store)
    store.close()


def test_a_missing_stored_node_is_a_key_error_then_rebuilt_on_the_next_commit(tmp_path: Path) -> None:
    import pytest

    path = tmp_path / "relay.sqlite3"
    envs = list(corpus())
    store = SqliteStore(path)
    store.commit_many([(env, 1) for env in envs[:-1]])
    n = store.log_size()
    root = merkle.root_hash(n, store.log_nodes)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM log_nodes WHERE level = ? AND idx = 0", (STRIDE,))
    conn.commit()
    conn.close()
    with pytest.raises(KeyError):
        merkle.inclusion_proof(2 << STRIDE, n, store.log_nodes)  # its sibling at level STRIDE + 1 folds the hole
    store._frontier = None  # as another process would: the frontier is read back, finds the hole, rebuilds
    store.commit(envs[-1], 2)
    assert merkle.verify_consistency(n, n + 1, root, merkle.root_hash(n + 1, store.log_nodes),
                                     merkle.consistency_proof(n, n + 1, store.log_nodes))
    assert_log_matches(store)
    store.close()
