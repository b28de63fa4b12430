"""The Redis backend's own cases (the storage contract runs over it in ``test_store_contract.py``)."""

from __future__ import annotations

import pytest
import redis

from akrelay.store.redis.store import RedisStore

# -- Redis-only behaviour ---------------------------------------------------------------------------------

import multiprocessing  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from akrelay.store.base import Record, StoreUnavailable  # noqa: E402
from akrelay.store.redis.store import FORMAT_VERSION, RedisFormatError, WeakDurability, check_durability  # noqa: E402
from akrelay.store.schema import SchemaVersionError  # noqa: E402
from redis_server import RedisServer  # noqa: E402
from store_contract import corpus  # noqa: E402


def test_namespaces_keep_deployments_apart(redis_url):
    one, two = RedisStore(redis_url, namespace="one"), RedisStore(redis_url, namespace="two")
    try:
        env = corpus()[0]
        assert one.commit(env, 1)[0].seq == 1
        assert two.get(env.id) is None and two.checkpoint() == 0
        assert two.commit(corpus()[1], 1)[0].seq == 1
        one.meta_set("k", b"1")
        assert two.meta_get("k") is None
    finally:
        one.close()
        two.close()


def test_unknown_format_version_is_refused_with_a_clear_message(redis_url):
    RedisStore(redis_url).close()
    client = redis.Redis.from_url(redis_url)
    client.set("akrelay:format", str(FORMAT_VERSION + 1))
    client.close()
    with pytest.raises(RedisFormatError) as caught:
        RedisStore(redis_url)
    assert isinstance(caught.value, SchemaVersionError)  # the CLI prints these without a traceback
    message = str(caught.value)
    assert f"format version {FORMAT_VERSION + 1}" in message and f"reads version {FORMAT_VERSION}" in message
    assert "akrelay" in message and redis_url.rsplit("/", 1)[0] in message


def test_resubmission_returns_the_original_bytes_from_any_store(redis_url):
    a, b = RedisStore(redis_url), RedisStore(redis_url)
    try:
        env = corpus()[3]
        first, created = a.commit(env, 7)
        again, created_again = b.commit(env, 99)
        assert created and not created_again
        assert (again.seq, again.accepted_at) == (first.seq, 7)
        assert again.to_json() == first.to_json() == b.get(env.id).to_json()
    finally:
        a.close()
        b.close()


def _commit_in_process(url, indexes, out):
    store = RedisStore(url)
    try:
        pool = corpus()
        for i in indexes:
            record, created = store.commit(pool[i], 5)
            out.put((pool[i].id, record.seq, created))
    finally:
        store.close()
        out.put(None)


def test_committers_in_several_processes_get_unique_gap_free_seqs(redis_url):
    pool = corpus()
    n = len(pool)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    # every envelope goes to two processes, in opposite orders
    plans = [list(range(i, n, 3)) for i in range(3)] + [list(range(i, n, 3))[::-1] for i in range(3)]
    procs = [ctx.Process(target=_commit_in_process, args=(redis_url, plan, out)) for plan in plans]
    for proc in procs:
        proc.start()
    results, done = [], 0
    deadline = time.monotonic() + 60
    while done < len(procs) and time.monotonic() < deadline:
        item = out.get(timeout=60)
        if item is None:
            done += 1
        else:
            results.append(item)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    created = [(event_id, seq) for event_id, seq, c in results if c]
    assert sorted(seq for _, seq in created) == list(range(1, n + 1))
    assert len({event_id for event_id, _ in created}) == n
    first = dict(created)
    assert all(first[event_id] == seq for event_id, seq, _ in results)
    store = RedisStore(redis_url)
    try:
        assert store.checkpoint() == n
        assert [r.seq for r in store.iter_records(0, 10 * n)] == list(range(1, n + 1))
    finally:
        store.close()


def test_commits_from_many_threads_share_script_calls_without_gaps(redis_url):
    store = RedisStore(redis_url)
    pool = list(corpus())
    try:
        threads = [threading.Thread(target=store.commit_many, args=([(e, 1) for e in pool[i::4]],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r.seq for r in store.iter_records(0, 1000)) == list(range(1, len(pool) + 1))
    finally:
        store.close()


def test_append_records_keeps_seq_and_refuses_overlap(redis_url, tmp_path):
    from akrelay.store.sqlite import SqliteStore

    source = SqliteStore(tmp_path / "relay.sqlite3")
    pool = corpus()
    for env in pool[:6]:
        source.commit(env, 10)
    source.set_withheld(pool[1].id, True)
    source.remove(pool[4].id)
    records = source.iter_records(0, 100)
    target = RedisStore(redis_url)
    try:
        assert target.append_records(records) == 6
        assert target.iter_records(0, 100) == records
        with pytest.raises(ValueError, match="duplicate id"):
            target.append_records(records[-1:])
        with pytest.raises(ValueError, match="not above"):
            target.append_records([Record(3, 1, pool[7])])
        assert target.checkpoint() == 6
        assert target.raise_high_water_mark(source.checkpoint()) == 6
        assert target.raise_high_water_mark(9) == 9
        assert target.commit(pool[8], 1)[0].seq == 10
        assert target.query([("type", pool[0].type)], after_seq=0, limit=100)[0].seq == 1
    finally:
        target.close()
        source.close()


@pytest.fixture
def private_redis(tmp_path):
    """A server of this test alone: it gets killed and reconfigured."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


def test_outage_raises_store_unavailable_and_the_store_recovers(private_redis):
    store = RedisStore(private_redis.url)
    pool = corpus()
    try:
        store.commit(pool[0], 1)
        private_redis.kill()
        calls = [
            lambda: store.commit(pool[1], 2), lambda: store.get(pool[0].id), lambda: store.get_many([pool[0].id]),
            store.checkpoint, lambda: store.iter_records(0, 5), lambda: store.query(text_terms=["a"]),
            lambda: store.set_withheld(pool[0].id, True), lambda: store.remove(pool[0].id),
            lambda: store.meta_get("k"), lambda: store.meta_set("k", b"v"), lambda: store.meta_setdefault("k", b"v"),
            store.ping, lambda: store.try_commit_many([(pool[1], 2)]),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                call()
            assert time.monotonic() - started < 10
            assert caught.value.retry_after >= 1
        private_redis.start()  # replays the AOF
        store.ping()
        assert store.get(pool[0].id).seq == 1
        assert store.commit(pool[1], 2)[0].seq == 2  # the script cache was lost with the server: reloaded
    finally:
        store.close()


def test_durability_check_reads_the_live_settings(private_redis):
    store = RedisStore(private_redis.url)
    client = redis.Redis.from_url(private_redis.url)
    try:
        check_durability(store)  # AOF on, appendfsync always
        client.config_set("appendfsync", "everysec")
        with pytest.raises(WeakDurability, match="appendfsync is 'everysec'.*CONFIG SET appendfsync always"):
            check_durability(store)
        check_durability(store, accept_weak=True)
        client.config_set("appendfsync", "always")
        client.config_set("appendonly", "no")
        with pytest.raises(WeakDurability, match="appendonly is 'no'.*--accept-weak-durability"):
            check_durability(store)
        check_durability(store, accept_weak=True)
    finally:
        client.close()
        store.close()


def test_durability_check_when_config_is_disabled(tmp_path):
    # started with CONFIG renamed away, as managed services do
    server = RedisServer(tmp_path / "redis", extra_args=("--rename-command", "CONFIG", "")).start()
    store = RedisStore(server.url)
    try:
        with pytest.raises(WeakDurability, match="CONFIG GET was refused.*managed Redis.*--accept-weak-durability"):
            check_durability(store)
        check_durability(store, accept_weak=True)
    finally:
        store.close()
        server.kill()


def test_watch_wakes_on_commits_of_another_store(redis_url):
    a, b = RedisStore(redis_url), RedisStore(redis_url)
    woken = threading.Event()
    try:
        stop = b.watch(woken.set)
        assert woken.wait(60)  # the first wake-up comes on subscribing
        woken.clear()
        time.sleep(0.2)
        a.commit(corpus()[0], 1)
        assert woken.wait(60)
        stop()
    finally:
        a.close()
        b.close()


def test_a_burst_of_commit_messages_wakes_a_watcher_a_few_times_and_the_last_wake_sees_the_last_commit(redis_url):
    """A busy deployment announces every commit group to every process: one wake-up each would cost
    every process a thread switch and a parse per group, so a burst is taken in a few wake-ups."""
    a, b = RedisStore(redis_url, namespace="burst"), RedisStore(redis_url, namespace="burst")
    seen: list[int] = []
    subscribed = threading.Event()

    def woken() -> None:
        seen.append(b.checkpoint())
        subscribed.set()

    client = redis.Redis.from_url(redis_url)
    try:
        stop = b.watch(woken)
        assert subscribed.wait(60)  # the first wake-up comes on subscribing
        time.sleep(0.2)
        seen.clear()
        pipe = client.pipeline(transaction=False)
        for i in range(300):  # what 300 commit groups on other nodes announce
            pipe.publish(b.channel, i)
        pipe.execute()
        a.commit(corpus()[0], 1)  # and a real one last
        deadline = time.monotonic() + 60
        while not (seen and seen[-1] == 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        stop()
        assert seen and seen[-1] == 1  # no commit is left without a wake-up after it
        assert len(seen) < 100, len(seen)
    finally:
        client.close()
        a.close()
        b.close()


def test_a_full_redis_refuses_a_commit_whole_and_leaves_no_gap(private_redis):
    store = RedisStore(private_redis.url)
    client = redis.Redis.from_url(private_redis.url)
    pool = corpus()
    try:
        store.commit(pool[0], 1)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        with pytest.raises(StoreUnavailable, match="maxmemory"):
            store.commit_many([(pool[1], 2), (pool[2], 3)])
        assert store.get(pool[1].id) is None and store.checkpoint() == 1  # nothing written; reads still work
        client.config_set("maxmemory", "0")
        assert [r.seq for r, _ in store.commit_many([(pool[1], 2), (pool[2], 3)])] == [2, 3]
    finally:
        client.close()
        store.close()


def test_iter_records_pages_past_one_call(redis_url, monkeypatch):
    import akrelay.store.redis.store as module

    monkeypatch.setattr(module, "ITER_CHUNK", 4)
    store = RedisStore(redis_url)
    try:
        pool = corpus()
        store.commit_many([(env, 1) for env in pool[:11]])
        assert [r.seq for r in store.iter_records(0, 100)] == list(range(1, 12))
        assert [r.seq for r in store.iter_records(2, 8)] == list(range(3, 11))
        assert store.iter_records(11, 5) == [] and store.iter_records(0, 0) == []
    finally:
        store.close()


def test_time_bounds_skip_whole_blocks_exactly(redis_url):
    """Past one 1024-seq block the created_at summaries prune; results equal the in-memory backend's."""
    import random

    from akrelay.protocol.signer import Signer, publish_event
    from akrelay.store.memory import MemoryStore
    from store_contract import BASE_TIME, LICENSE, envelope_from_signed

    rng = random.Random(5)
    signer = Signer.from_seed(b"\x09" * 32)
    envs = []
    for i in range(2600):
        # mostly rising with the seq, with a scattered minority, so some blocks prune and some do not
        created = BASE_TIME + (i * 1000 if rng.random() < 0.9 else rng.randrange(0, 2600) * 1000)
        payload = {"license": LICENSE, "kind": rng.choice(("claim", "question")), "title": f"t{i}",
                   "statement": "s", "language": "en", "tags": [rng.choice(("a", "b"))],
                   "context": {"scope": "x", "conditions": [], "limitations": []}, "basis": "b"}
        envs.append(envelope_from_signed(signer.sign(publish_event(signer.agent_id, created, i + 1, payload))))
    store, oracle_store = RedisStore(redis_url), MemoryStore()
    try:
        store.commit_many([(e, 1) for e in envs])
        oracle_store.commit_many([(e, 1) for e in envs])
        for _ in range(40):
            lo = BASE_TIME + rng.randrange(0, 2700) * 1000 if rng.random() < 0.8 else None
            hi = BASE_TIME + rng.randrange(0, 2700) * 1000 if rng.random() < 0.5 else None
            terms = rng.choice(([], [("tag", "a")], [("kind", "question"), ("tag", "b")]))
            after, limit = rng.randrange(0, 2600), rng.choice((1, 7, 100, 5000))
            expected = oracle_store.query(terms, lo, hi, after_seq=after, limit=limit)
            got = store.query(terms, lo, hi, after_seq=after, limit=limit)
            assert [r.seq for r in got] == [r.seq for r in expected], (terms, lo, hi, after, limit)
    finally:
        store.close()
