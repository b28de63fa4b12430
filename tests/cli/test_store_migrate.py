"""``akrelay store migrate`` moves a SQLite relay's log into Redis with every seq kept; CLI commands honour --store."""

from __future__ import annotations

import json

from akrelay.cli import main
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import CURSOR_SECRET_KEY, open_relay, open_shared_relay
from akrelay.store.redis.store import RedisStore
from store_contract import corpus


def _sqlite_relay_with_data(data):
    relay = open_relay(data, RelayConfig(), text_indexer=False)
    pool = corpus()
    for i, env in enumerate(pool[:12]):
        relay.store.commit(env, 1_000 + i)
    relay.store.set_withheld(pool[2].id, True)
    relay.store.remove(pool[11].id)  # the high-water mark (12) stays above the last record (11)
    relay.store.remove(pool[5].id)
    return relay


def test_migrate_copies_every_record_with_its_seq_and_the_cursor_secret(tmp_path, redis_url, capsys):
    data = tmp_path / "data"
    relay = _sqlite_relay_with_data(data)
    records = relay.store.iter_records(0, 100)
    page = relay.query([("limit", "3")])
    secret = relay.store.meta_get(CURSOR_SECRET_KEY)
    relay.close()

    assert main(["store", "migrate", "--data", str(data), "--to", redis_url]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == len(records) == 10 and summary["checkpoint"] == 12

    store = RedisStore(redis_url)
    try:
        assert store.iter_records(0, 100) == records  # same seqs, accepted_at, withheld state and bytes
        assert store.checkpoint() == 12
        assert store.meta_get(CURSOR_SECRET_KEY) == secret
    finally:
        store.close()
    shared = open_shared_relay(redis_url, RelayConfig())
    try:
        pool = corpus()
        again, created = shared.store.commit(pool[0], 99)
        assert not created and again.seq == 1 and again.accepted_at == 1_000
        assert shared.store.commit(pool[20], 5)[0].seq == 13  # a removed record's seq is never reused
        following = shared.query([("limit", "3"), ("cursor", page.next_cursor)])  # an old cursor still works
        assert [r.seq for r in page.records] == [1, 2, 4]  # 3 is withheld
        assert [r.seq for r in following.records] == [5, 7, 8]  # 6 was removed
    finally:
        shared.close()

    # a second migration into the now non-empty target is refused
    assert main(["store", "migrate", "--data", str(data), "--to", redis_url]) == 2
    assert "already holds a log" in capsys.readouterr().err


def test_migrate_refuses_a_missing_source_and_weak_durability(tmp_path, redis_url, capsys):
    assert main(["store", "migrate", "--data", str(tmp_path / "none"), "--to", redis_url]) == 2
    assert "no SQLite relay store" in capsys.readouterr().err
    assert main(["store", "migrate", "--data", str(tmp_path), "--to", "sqlite"]) == 2
    assert "redis://" in capsys.readouterr().err


def test_withhold_honours_store(tmp_path, redis_url, capsys):
    relay = open_shared_relay(redis_url, RelayConfig())
    env = corpus()[0]
    relay.store.commit(env, 1)
    relay.close()
    assert main(["withhold", "--data", str(tmp_path / "node"), "--store", redis_url, "--", env.id]) == 0
    assert json.loads(capsys.readouterr().out) == {"event_id": env.id, "seq": 1, "state": "withheld"}
    store = RedisStore(redis_url)
    try:
        assert store.get(env.id).withheld is True
    finally:
        store.close()
