"""The nexus storage interface: one contract for both backends, and the on-disk file's life.

The contract tests run on the backend the autouse ``nexus_backend`` fixture selects,
and compare every lookup at every seq with the in-memory reference. The file tests
cover what only the SQLite backend has: format versions checked on open, rebuild of
a missing/corrupt/foreign-Space file, one importer per data directory, a consistent
prefix after ``kill -9`` during import, and ``akrelay reindex --kip``.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from akrelay.kip import KipConfig
from akrelay.kip.elements import KIND_OF, Assertion, Concept, Evidence, Proposition
from akrelay.kip.errors import KipError
from akrelay.kip.follower import follow, rebuild
from akrelay.kip.mapping import import_record
from akrelay.kip.nexus import ELEMENT_KINDS, SEARCH_KINDS, Nexus, tokens
from akrelay.kip.nexus_sqlite import (
    FORMAT_VERSION, NEXUS_FILE, NexusFileError, SqliteNexus, nexus_path, open_writer,
)
from akrelay.kip.runtime import KipRuntime
from akrelay.kip.wiring import IMPORTER_LOCK, open_runtime, reindex
from akrelay.leader import LeaderLock
from akrelay.store.sqlite import SqliteStore

from .conftest import ORIGIN, World
from .test_history import random_world, store_of

SPACE = KipConfig(origin=ORIGIN).space_id


def _ids(elements) -> list[str]:
    return [e.id for e in elements]


def _probe(nexus, seq: int) -> dict:
    """Every lookup of the interface at ``seq``, as comparable values."""
    out: dict = {"head_tx": nexus.transaction_at(seq), "counts": nexus.counts(seq)}
    elements = [e for e in nexus.all_elements() if e.created_seq <= seq]
    for e in elements:
        got = nexus.get(e.id, seq)
        out[("get", e.id)] = (repr(got), nexus.view(got, seq))
        if isinstance(e, Concept):
            out[("concept", e.id)] = repr(nexus.concept(e.type, e.key, seq))
            out[("named", e.id)] = _ids(nexus.concepts_named(e.type, e.name, seq))
            out[("about", e.id)] = _ids(nexus.propositions_about(e.id, seq))
            out[("to", e.id)] = _ids(nexus.propositions_to(e.id, seq))
            out[("by", e.id)] = _ids(nexus.assertions_by(e.id, seq))
            out[("type", e.type)] = _ids(nexus.concepts_of_type(e.type, seq))
            out[("type_count", e.type)] = nexus.type_count(e.type, seq)
            for f, t in e.structural.items():
                out[("struct", f, t)] = _ids(nexus.structural_sources(f, t, seq))
                out[("struct", f)] = _ids(nexus.structural_sources(f, None, seq))
        elif isinstance(e, Proposition):
            out[("prop", e.id)] = repr(nexus.proposition(e.subject, e.predicate, e.object, seq))
            out[("with", e.predicate)] = _ids(nexus.propositions_with(e.predicate, seq))
            out[("on", e.id)] = _ids(nexus.assertions_on(e.id, seq))
        elif isinstance(e, Evidence):
            out[("evidence", e.id)] = repr(nexus.evidence_by_key(e.client_key, seq))
    for kind in ELEMENT_KINDS:
        out[("kind", kind)] = _ids(nexus.of_kind(kind, seq))
    for kind in SEARCH_KINDS:
        for term in ("title", "words", "summary", "support", "agent", "nothing-here"):
            out[("terms", kind, term)] = sorted(nexus.term_matches(kind, tokens(term + " 1 2"), seq).items())
        for words in ("title", "title words", "summary title", "title words summary", "support agent nothing"):
            buckets = [(m, list(o)) for m, o in nexus.term_buckets(kind, tokens(words), seq)]
            out[("buckets", kind, words)] = [(m, o) for m, o in buckets if o]
    return out


@pytest.mark.parametrize("seed", [21, 22])
def test_every_lookup_agrees_with_the_memory_reference_at_every_seq(seed: int) -> None:
    world = random_world(seed, events=40)
    tested = world.nexus()
    reference_memory = Nexus(SPACE)
    for record in world.records:
        import_record(reference_memory, record)
    assert tested.fingerprint() == reference_memory.fingerprint()
    for seq in sorted({0, 1, 7, 19, len(world.records)}):
        with tested.reading():
            got = _probe(tested, seq)
        assert got == _probe(reference_memory, seq), seq
    assert tested.head == len(world.records)


def test_reads_filter_by_seq_and_check_the_snapshot(world: World) -> None:
    cap = world.publish("alice", title="Cache warmup")
    world.assess("bob", cap.id, "supports")
    world.retract("bob", world.records[1].envelope.id)
    nexus = world.nexus()
    assert nexus.head == 3
    holds = nexus.holds(cap.id)
    assert nexus.holds(cap.id, 0) is None and nexus.get(holds.id, 0) is None and nexus.get(holds.id, 1) is not None
    bob = [a for a in nexus.assertions_on(holds.id) if a.actor == world.did("bob")][0]
    assert nexus.assertions_on(holds.id, 1) == [a for a in nexus.assertions_on(holds.id) if a.created_seq <= 1]
    assert (bob.status_at(2), bob.status_at(3)) == ("active", "retracted")
    assert nexus.transaction_at(2).seq == 2 and nexus.transaction_at(0) is None
    assert nexus.counts(1)["assertion"] == 1 and nexus.counts()["assertion"] == 2
    assert nexus.type_count("Agent", 1) == 1 and nexus.type_count("Agent") == 2
    for bad, code in ((-1, "ConstraintViolation"), (4, "HistoricalSnapshotUnavailable"), ("1", "TypeMismatch")):
        with pytest.raises(KipError) as exc:
            nexus.check_seq(bad)
        assert exc.value.code == code
    assert nexus.concepts_named("KnowledgeCapsule", "Cache warmup")[0].key == cap.id
    assert nexus.concepts_named("KnowledgeCapsule", "cache warmup") == []
    (ordinal,) = nexus.term_matches("concept", {"warmup"}, 3)
    assert nexus.at_ordinal(ordinal).key == cap.id
    assert nexus.term_matches("concept", {"warmup"}, 0) == {}


def test_an_element_id_is_never_reused(world: World) -> None:
    world.publish("alice")
    nexus = world.nexus()
    agent = nexus.agent(world.did("alice"))
    with pytest.raises(RuntimeError, match="reused"), nexus.batch():
        nexus.add(agent)


def test_concept_names_are_found_after_nfc_normalisation() -> None:
    world = World()
    world.publish("alice", title="Cafe\u0301 latency")        # decomposed é
    nexus = world.nexus()
    (found,) = nexus.concepts_named("KnowledgeCapsule", "Caf\u00e9 latency")  # composed é
    assert found.name == "Cafe\u0301 latency"


# ---------------------------------------------------------------------- the file


@pytest.fixture
def sqlite_only(nexus_backend: str) -> None:
    if nexus_backend != "sqlite":
        pytest.skip("a property of the on-disk backend")


def _sqlite_store(tmp_path: Path, world: World) -> SqliteStore:
    store = SqliteStore(tmp_path / "relay.sqlite3")
    for record in world.records:
        stored, created = store.commit(record.envelope, record.accepted_at)
        assert created and stored.seq == record.seq
    return store


def _memory_reference(world: World, upto: int | None = None) -> Nexus:
    nexus = Nexus(SPACE)
    for record in world.records[:upto]:
        import_record(nexus, record)
    return nexus


def test_a_batch_is_all_or_nothing(tmp_path: Path, sqlite_only: None) -> None:
    world = random_world(3, events=12)
    nexus = open_writer(tmp_path / NEXUS_FILE, SPACE)
    follow(store_of(world), nexus, max_records=5)
    before = nexus.fingerprint()
    with pytest.raises(ZeroDivisionError), nexus.batch():
        for record in world.records[5:9]:
            import_record(nexus, record)
        1 / 0
    assert nexus.fingerprint() == before and nexus.head == 5
    follow(store_of(world), nexus)
    assert nexus.fingerprint() == _memory_reference(world).fingerprint()
    nexus.close()


def test_an_unknown_format_version_is_refused_never_read(tmp_path: Path, sqlite_only: None) -> None:
    path = tmp_path / NEXUS_FILE
    writer = open_writer(path, SPACE)
    writer.close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {FORMAT_VERSION + 1}")
    conn.close()
    with pytest.raises(NexusFileError, match=f"format version {FORMAT_VERSION + 1}.*reindex --kip") as exc:
        open_writer(path, SPACE)
    assert not exc.value.rebuildable
    reader = SqliteNexus(path, SPACE)
    with pytest.raises(KipError) as refused:
        reader.head
    assert refused.value.code == "InternalError" and "format version" in refused.value.message
    with sqlite3.connect(path) as conn:  # the file was left alone
        assert conn.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION + 1


def test_a_runtime_over_a_refused_file_answers_a_clear_error(tmp_path: Path, sqlite_only: None) -> None:
    path = tmp_path / NEXUS_FILE
    open_writer(path, SPACE).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    rt = KipRuntime(KipConfig(origin=ORIGIN), SqliteNexus(path, SPACE))
    status, body = rt.execute({"kip": "2.0", "operations": [{"command": "DESCRIBE SNAPSHOT"}]})
    assert status == 503 and body["status"] == "failed"
    assert body["error"]["code"] == "InternalError" and "format version 99" in body["error"]["message"]
    missing = KipRuntime(KipConfig(origin=ORIGIN), SqliteNexus(tmp_path / "nowhere" / NEXUS_FILE, SPACE))
    status, body = missing.execute({"kip": "2.0", "operations": [{"command": "DESCRIBE SNAPSHOT"}]})
    assert status == 503 and "does not exist yet" in body["error"]["message"]


def test_a_foreign_sqlite_file_is_refused(tmp_path: Path, sqlite_only: None) -> None:
    path = tmp_path / NEXUS_FILE
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE mine(x)")
    with pytest.raises(NexusFileError, match="not an akrelay KIP nexus"):
        open_writer(path, SPACE)


@pytest.mark.parametrize("damage", ["garbage", "other_space", "ahead_of_log", "missing"])
def test_an_unusable_file_is_rebuilt_from_the_log(tmp_path: Path, damage: str, sqlite_only: None) -> None:
    world = random_world(5, events=15)
    store = store_of(world)
    path = tmp_path / NEXUS_FILE
    if damage == "garbage":
        path.write_bytes(b"this is not a database at all" * 200)
    elif damage == "other_space":
        open_writer(path, "akrelay:other.example").close()
    elif damage == "ahead_of_log":
        bigger = random_world(5, events=30)
        nexus = open_writer(path, SPACE)
        follow(store_of(bigger), nexus)
        nexus.close()
    nexus = open_writer(path, SPACE, checkpoint=store.checkpoint())
    assert nexus.head == 0
    follow(store, nexus)
    assert nexus.fingerprint() == _memory_reference(world).fingerprint()
    nexus.close()


_KILLED_IMPORTER = textwrap.dedent("""
    import sys, time
    import akrelay.kip.follower as follower
    from akrelay.kip.nexus_sqlite import open_writer
    from akrelay.store.sqlite import SqliteStore

    real = follower.import_record
    def stuck(nexus, record):
        if record.seq == int(sys.argv[4]):  # mid-chunk: the kill lands inside an import transaction
            print("stuck", flush=True)
            time.sleep(3600)
        return real(nexus, record)
    follower.import_record = stuck
    store = SqliteStore(sys.argv[1])
    nexus = open_writer(sys.argv[2], sys.argv[3])
    print("importing", flush=True)
    follower.follow(store, nexus, chunk=7)
    print("done", flush=True)
""")


def test_kill_9_during_import_leaves_a_prefix_and_catches_up(tmp_path: Path, sqlite_only: None) -> None:
    world = random_world(9, events=160)
    store = _sqlite_store(tmp_path, world)
    path = tmp_path / NEXUS_FILE
    # chunks of 7: records 1..35 are committed, 36..38 imported in the open transaction when 39 blocks
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_IMPORTER, str(tmp_path / "relay.sqlite3"), str(path),
                             SPACE, "39"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "importing"
        assert proc.stdout.readline().strip() == "stuck"  # a condition, not a race against the importer
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    nexus = open_writer(path, SPACE, checkpoint=store.checkpoint())
    head = nexus.head
    assert 30 <= head < len(world.records)  # killed mid-import, and nothing torn
    prefix = Nexus(SPACE)
    follow(store, prefix, max_records=head)
    assert nexus.fingerprint() == prefix.fingerprint()
    follow(store, nexus)
    assert nexus.fingerprint() == rebuild(store, SPACE).fingerprint()
    nexus.close()
    store.close()


def _two_workers(tmp_path: Path, seed: int, events: int):
    """A data directory and two runtimes on it, as two Granian workers open them (the first leads)."""
    world = random_world(seed, events=events)
    store = _sqlite_store(tmp_path, world)
    return world, store, open_runtime(store, tmp_path, origin=ORIGIN, follow=False), \
        open_runtime(store, tmp_path, origin=ORIGIN, follow=False)


def test_one_importer_per_data_directory_and_readers_follow_it(tmp_path: Path, sqlite_only: None) -> None:
    world, store, (first, first_follower), (second, second_follower) = _two_workers(tmp_path, 13, 30)
    assert first_follower.writer is not None and second_follower.writer is None
    assert first.nexus.head == second.nexus.head == len(world.records)
    assert isinstance(second.nexus, SqliteNexus) and not second.nexus.writer
    answer = second.execute({"kip": "2.0", "operations": [{"command": "DESCRIBE SNAPSHOT"}]})[1]
    assert answer["results"][0]["result"]["space_seq"] == len(world.records)
    # the leader stops: the other process takes over on its next step
    first_follower.stop()
    env = world.publish("alice", title="After the handover")
    store.commit(env, world.records[-1].accepted_at)
    assert second_follower.catch_up() == 1 and second_follower.writer is not None
    assert second.nexus.capsule(env.id) is not None
    second_follower.stop()
    store.close()


def test_a_reader_waits_for_the_importer_on_request(tmp_path: Path, sqlite_only: None) -> None:
    world, store, (_, leader), (reader_rt, reader) = _two_workers(tmp_path, 17, 10)
    env = world.publish("bob", title="Fresh")
    store.commit(env, world.records[-1].accepted_at)
    waiting = threading.Event()

    class Watched:
        """The reader's view of the store: says when the reader has read the head it waits for."""

        def __getattr__(self, name):
            return getattr(store, name)

        def checkpoint(self):
            head = store.checkpoint()
            waiting.set()
            return head

    reader.store = Watched()
    # the leader imports only once the reader waits (an event, not a timer: a loaded machine may be slow)
    importer = threading.Thread(target=lambda: waiting.wait(120) and leader.catch_up())
    importer.start()
    assert reader.catch_up(timeout=120.0) == 0   # returned once the leader had imported it
    assert reader_rt.nexus.capsule(env.id) is not None
    importer.join(120)
    assert reader.catch_up(timeout=0.05) == 0
    store.commit(world.publish("bob", title="Later"), world.records[-1].accepted_at)
    assert reader.catch_up(timeout=0.05) == -1  # nobody imports: the reader does not wait forever
    leader.stop()
    reader.stop()
    store.close()


def test_a_worker_that_does_not_follow_never_imports_even_with_the_lock_free(tmp_path: Path, sqlite_only: None) -> None:
    """``importer=False`` (the workers under ``akrelay serve --followers process``): no thread, no lock, no writer."""
    world = random_world(29, events=10)
    store = _sqlite_store(tmp_path, world)
    leader_rt, leader = open_runtime(store, tmp_path, origin=ORIGIN, follow=False)
    leader.stop()  # the importing process is gone: the lock is free
    reader_rt, reader = open_runtime(store, tmp_path, origin=ORIGIN, follow=True, importer=False)
    assert not reader.is_alive() and reader.writer is None
    env = world.publish("carol", title="Only the importing process imports this")
    store.commit(env, world.records[-1].accepted_at)
    assert reader.catch_up(timeout=0.1) == -1 and reader.writer is None
    lock = LeaderLock(tmp_path / IMPORTER_LOCK)
    assert lock.acquire()  # the reader never took it
    lock.release()
    importer_rt, importer = open_runtime(store, tmp_path, origin=ORIGIN, follow=False)  # the importing process
    assert importer.writer is not None
    assert reader.catch_up(timeout=60.0) == 0 and reader_rt.nexus.capsule(env.id) is not None
    importer.stop()
    reader.stop()
    store.close()


def test_reindex_rebuilds_and_is_refused_while_an_importer_runs(tmp_path: Path, sqlite_only: None) -> None:
    world = random_world(19, events=20)
    store = _sqlite_store(tmp_path, world)
    path = nexus_path(tmp_path)
    path.write_bytes(b"\0" * 4096)
    (tmp_path / "kip-nexus.pickle").write_bytes(b"an old snapshot")
    lock = LeaderLock(tmp_path / IMPORTER_LOCK)
    assert lock.acquire()
    with pytest.raises(RuntimeError, match="stop it before"):
        reindex(store, tmp_path, origin=ORIGIN)
    lock.release()
    summary = reindex(store, tmp_path, origin=ORIGIN)
    assert summary["space_seq"] == len(world.records) and summary["format_version"] == FORMAT_VERSION
    assert not (tmp_path / "kip-nexus.pickle").exists()
    reader = SqliteNexus(path, SPACE)
    assert reader.fingerprint() == rebuild(store, SPACE).fingerprint()
    reader.close()
    store.close()


def test_a_reader_sees_one_snapshot_per_request_and_follows_a_rebuild(tmp_path: Path, sqlite_only: None) -> None:
    world = random_world(23, events=20)
    store = store_of(world)
    path = tmp_path / NEXUS_FILE
    writer = open_writer(path, SPACE)
    follow(store, writer, max_records=10)
    rt = KipRuntime(KipConfig(origin=ORIGIN), SqliteNexus(path, SPACE))
    with rt.lock:
        assert rt.nexus.head == 10
        follow(store, writer)                       # the importer commits meanwhile
        assert rt.nexus.head == 10 and rt.nexus.counts() == rt.nexus.counts(10)
    assert rt.nexus.head == len(world.records)
    writer.close()
    # a shorter log (the store was replaced): the next importer empties the file in place
    shorter = store_of(random_world(23, events=6))
    writer = open_writer(path, SPACE, checkpoint=shorter.checkpoint())
    assert rt.nexus.head == 0
    follow(shorter, writer)
    assert rt.nexus.fingerprint() == rebuild(shorter, SPACE).fingerprint()
    writer.close()
    rt.nexus.close()


def test_the_element_kinds_cover_the_decoders() -> None:
    assert set(KIND_OF.values()) == set(ELEMENT_KINDS)
    assert isinstance(Assertion("a", "p", "b", "x", "support", "t", [], {}, 1, "t", "e").transitions, list)


def test_rebuild_in_memory_equals_the_disk_rebuild(tmp_path: Path, sqlite_only: None) -> None:
    world = random_world(29, events=25)
    store = store_of(world)
    disk = open_writer(tmp_path / NEXUS_FILE, SPACE)
    follow(store, disk, chunk=3)
    assert disk.fingerprint() == rebuild(store, SPACE).fingerprint()
    agent = next(disk.of_kind("concept"))
    disk.close()
    reader = SqliteNexus(tmp_path / NEXUS_FILE, SPACE)
    with pytest.raises(RuntimeError, match="reading"), reader.batch():  # a reader never writes
        reader.add(agent)
    reader.close()


def test_a_graceful_stop_interrupts_a_long_backlog_at_a_batch_boundary(tmp_path: Path, monkeypatch,
                                                                       sqlite_only: None) -> None:
    import akrelay.kip.follower as follower_module

    world = random_world(31, events=200)
    store = _sqlite_store(tmp_path, world)
    real = follower_module.import_record
    reached, opened, followers = threading.Event(), threading.Event(), []

    def held(nexus, record):
        if record.seq == 25:  # mid-batch: the import waits here until the stop is asked for
            reached.set()
            opened.wait(120)
            followers[0]._halt.wait(120)
        return real(nexus, record)

    monkeypatch.setattr(follower_module, "import_record", held)
    monkeypatch.setattr(follower_module, "DISK_BATCH", 10)
    monkeypatch.setattr(follower_module, "REQUEST_CATCH_UP", 0)  # the whole backlog is the thread's
    path = nexus_path(tmp_path)
    runtime, follower = open_runtime(store, tmp_path, origin=ORIGIN, follow=True)
    followers.append(follower)
    opened.set()
    assert reached.wait(120)
    follower.stop(timeout=120)
    reader = SqliteNexus(path, SPACE)
    head = reader.head
    assert 20 <= head < len(world.records) and head % 10 == 0  # stopped between batches, mid-backlog
    reader.close()
    store.close()


def test_a_one_shot_reader_of_another_origin_leaves_the_relays_file_alone(tmp_path: Path, sqlite_only: None) -> None:
    world = random_world(37, events=12)
    store = _sqlite_store(tmp_path, world)
    _, relay_follower = open_runtime(store, tmp_path, origin=ORIGIN, follow=False)
    relay_follower.stop()
    before = SqliteNexus(nexus_path(tmp_path), SPACE).fingerprint()
    other = "https://elsewhere.example"
    rt, follower = open_runtime(store, tmp_path, origin=other, follow=False)  # akrelay kip --origin ...
    assert isinstance(rt.nexus, Nexus) and rt.nexus.space_id == KipConfig(origin=other).space_id
    assert rt.nexus.head == len(world.records)
    follower.stop()
    assert SqliteNexus(nexus_path(tmp_path), SPACE).fingerprint() == before
    store.close()


def test_every_lookup_is_an_index_search_not_a_scan(tmp_path: Path, sqlite_only: None) -> None:
    """Each SELECT a lookup runs is planned as an index (or rowid) search: no full scan of elements."""
    world = random_world(41, events=20)
    nexus = open_writer(tmp_path / NEXUS_FILE, SPACE)
    follow(store_of(world), nexus)
    statements: list[str] = []
    nexus._conn.set_trace_callback(statements.append)
    cap = next(nexus.concepts_of_type("KnowledgeCapsule"))
    agent = next(nexus.concepts_of_type("Agent"))
    holds = nexus.holds(cap.key)
    list(nexus.concepts_named("KnowledgeCapsule", cap.name))
    nexus.get(cap.id)
    nexus.propositions_about(cap.id)
    nexus.propositions_to(cap.id)
    list(nexus.propositions_with("ak_holds"))
    nexus.assertions_on(holds.id)
    list(nexus.assertions_by(agent.id))
    nexus.assertions_from_event(cap.key)
    nexus.evidence_for_event(cap.key)
    list(nexus.structural_sources("ak_published_by", agent.id))
    nexus.transaction_at(3)
    nexus.type_count("Agent", 3)
    nexus.at_ordinal(0)
    list(nexus.term_buckets("concept", {"title", "words"}, nexus.head))
    nexus._conn.set_trace_callback(None)
    selects = {s for s in statements if s.lstrip().upper().startswith("SELECT")}
    assert len(selects) >= 15
    for sql in selects:
        plan = " | ".join(row[3] for row in nexus._conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "SCAN elements" not in plan and "SCAN tx" not in plan, (sql, plan)
    nexus.close()


def _tagged_world(seed: int) -> World:
    import random

    rng = random.Random(seed)
    world = World()
    published: list[str] = []
    for n in range(24):
        tags = rng.sample(["red", "green", "blue", "a.b-c"], rng.randint(0, 3))
        relations = [("extends", rng.choice(published))] if published and rng.random() < 0.4 else None
        published.append(world.publish(rng.choice(["alice", "bob", "carol"]), title=f"T {n}", tags=tags,
                                       relations=relations).id)
    return world


def test_the_tag_index_agrees_with_the_memory_reference_at_every_seq() -> None:
    """``concepts_tagged`` (tags, and tags with a structural edge) on both backends, every seq."""
    world = _tagged_world(31)
    tested, reference = world.nexus(), _memory_reference(world)
    concepts = [e for e in reference.all_elements() if isinstance(e, Concept)]
    edges = {(f, t) for c in concepts for f, t in c.structural.items()} | {("ak_published_by", "nobody")}
    for seq in (0, 5, 13, len(world.records)):
        for tags in (["red"], ["green", "blue"], ["a.b-c", "red", "red"], ["absent"], ["red", "absent"]):
            want = [c.id for c in concepts if c.created_seq <= seq and all(t in c.attributes.get("tags", ())
                                                                           for t in tags)]
            with tested.reading():
                assert _ids(tested.concepts_tagged(tags, seq)) == want == _ids(reference.concepts_tagged(tags, seq))
            for edge in edges:
                with_edge = [i for i in want if reference.get(i).structural.get(edge[0]) == edge[1]]
                with tested.reading():
                    assert _ids(tested.concepts_tagged(tags, seq, structural=edge)) == with_edge, (tags, edge)
                assert _ids(reference.concepts_tagged(tags, seq, structural=edge)) == with_edge
    with pytest.raises(ValueError):
        list(tested.concepts_tagged([]))


def test_a_tag_intersection_reads_index_tables_only(tmp_path: Path, sqlite_only: None) -> None:
    """Whichever posting drives, the statements are index searches: no scan of any table."""
    world = _tagged_world(32)
    nexus = open_writer(tmp_path / NEXUS_FILE, SPACE)
    follow(store_of(world), nexus)
    agent = next(nexus.concepts_of_type("Agent"))
    statements: list[str] = []
    nexus._conn.set_trace_callback(statements.append)
    for tags, edge in ((["red"], None), (["red", "green"], None), (["blue"], ("ak_published_by", agent.id)),
                       (["red", "green", "blue"], ("ak_published_by", agent.id))):
        list(nexus.concepts_tagged(tags, structural=edge))
    nexus._conn.set_trace_callback(None)
    selects = {s for s in statements if s.lstrip().upper().startswith("SELECT")}
    assert len(selects) >= 4
    for sql in selects:
        plan = " | ".join(row[3] for row in nexus._conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "SCAN" not in plan.replace("SCAN (subquery", ""), (sql, plan)
        if "FROM elements" in sql:  # the rows of the intersection only, by rowid
            assert "SEARCH elements USING INTEGER PRIMARY KEY (rowid=?)" in plan, (sql, plan)
    nexus.close()


def test_a_file_of_an_older_format_version_is_rebuilt_from_the_log(tmp_path: Path, sqlite_only: None) -> None:
    """Version 1 had no tag index: reading it with this layout would miss tags, so it is rebuilt."""
    world = _tagged_world(33)
    path = tmp_path / NEXUS_FILE
    nexus = open_writer(path, SPACE)
    follow(store_of(world), nexus)
    nexus.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM tags")
        conn.execute("PRAGMA user_version = 1")
    reader = SqliteNexus(path, SPACE)
    with pytest.raises(KipError, match="older format version 1"):
        reader.head
    nexus = open_writer(path, SPACE)
    assert nexus.head == 0 and (tmp_path / (NEXUS_FILE + ".discarded")).exists()
    follow(store_of(world), nexus)
    assert nexus.fingerprint() == _memory_reference(world).fingerprint()
    assert reader.head == len(world.records) and list(reader.concepts_tagged(["red"]))
    nexus.close()
    reader.close()


def test_assertions_by_author_in_id_order_walk_an_index_without_sorting(tmp_path: Path, sqlite_only: None) -> None:
    world = random_world(43, events=40)
    nexus = open_writer(tmp_path / NEXUS_FILE, SPACE)
    follow(store_of(world), nexus)
    reference = _memory_reference(world)
    statements: list[str] = []
    nexus._conn.set_trace_callback(statements.append)
    for agent in list(reference.concepts_of_type("Agent")):
        for seq in (10, nexus.head):
            got = _ids(nexus.assertions_by(agent.id, seq))
            created = [a.id for a in reference.all_elements() if isinstance(a, Assertion)
                       and a.asserted_by == agent.id and a.created_seq <= seq]
            assert got == sorted(created) == _ids(reference.assertions_by(agent.id, seq))
    nexus._conn.set_trace_callback(None)
    for sql in {s for s in statements if "ORDER BY id" in s}:
        plan = " | ".join(row[3] for row in nexus._conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "USING INDEX a_author (b=? AND id>?)" in plan and "TEMP B-TREE" not in plan, plan
    nexus.close()
