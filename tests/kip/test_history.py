"""The nexus is a deterministic function of the log: rebuild == incremental, and
``AS OF SEQ`` reproduces the answers given at that seq."""

from __future__ import annotations

import random

import pytest

from akrelay.kip import KipConfig
from akrelay.kip.follower import KipFollower, follow, rebuild
from akrelay.kip.runtime import KipRuntime
from akrelay.store.memory import MemoryStore

from .conftest import ORIGIN, World, new_nexus

VERDICTS = ("supports", "challenges", "reproduced", "not_reproduced", "applied", "inconclusive")
KINDS = ("observation", "hypothesis", "question", "inference", "collection", "negative_result")


def random_world(seed: int, events: int = 60) -> World:
    rng = random.Random(seed)
    world = World()
    actors = ["alice", "bob", "carol", "dave"]
    published: list[tuple[str, str]] = []      # (actor, id)
    assessments: list[tuple[str, str]] = []
    retracted: set[str] = set()
    for _ in range(events):
        roll = rng.random()
        actor = rng.choice(actors)
        if not published or roll < 0.4:
            kind = rng.choice(KINDS)
            rels = []
            if published and kind != "collection" and rng.random() < 0.5:
                rels.append((rng.choice(["derived_from", "extends", "supports", "contradicts"]), rng.choice(published)[1]))
            if kind == "collection":
                rels.append(("contains", rng.choice(published)[1]) if published else None)
                rels = [r for r in rels if r]
                if not rels:
                    kind = "observation"
            own = [pid for a, pid in published if a == actor]
            if own and kind not in ("collection",) and rng.random() < 0.3:
                rels.append(("supersedes", rng.choice(own)))
            env = world.publish(actor, kind, f"Title {rng.randint(0, 50)} words", relations=rels or None)
            published.append((actor, env.id))
        elif roll < 0.8:
            env = world.assess(actor, rng.choice(published)[1], rng.choice(VERDICTS), f"summary {rng.randint(0, 9)}")
            assessments.append((actor, env.id))
        else:
            own = [i for a, i in published + assessments if a == actor and i not in retracted]
            if own:
                target = rng.choice(own)
                world.retract(actor, target)
                retracted.add(target)
    return world


def store_of(world: World) -> MemoryStore:
    store = MemoryStore()
    for record in world.records:
        stored, created = store.commit(record.envelope, record.accepted_at)
        assert created and stored.seq == record.seq
    return store


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_equals_rebuild(seed: int) -> None:
    world = random_world(seed)
    store = store_of(world)
    space = KipConfig(origin=ORIGIN).space_id
    incremental = new_nexus(space)   # each backend, against the in-memory rebuild
    rng = random.Random(seed)
    while incremental.head < store.checkpoint():
        follow(store, incremental, batch=rng.randint(1, 7), max_records=rng.randint(1, 9))
    rebuilt = rebuild(store, space)
    assert incremental.fingerprint() == rebuilt.fingerprint()
    assert rebuilt.head == len(world.records)


def test_follower_catches_up_into_the_runtime_nexus() -> None:
    world = random_world(11, events=20)
    store = store_of(world)
    rt = KipRuntime(KipConfig(origin=ORIGIN), new_nexus(KipConfig(origin=ORIGIN).space_id))
    follower = KipFollower(store, rt)
    n = len(world.records)
    assert follower.catch_up() == n and rt.nexus.head == n
    assert follower.catch_up() == 0
    follower.stop()


COMMANDS = ['DESCRIBE SNAPSHOT', 'SEARCH CONCEPT "title words"', 'SEARCH ASSERTION "summary"',
            'SEARCH EVIDENCE "title"', 'DESCRIBE SCHEMA ENVIRONMENT']


@pytest.mark.parametrize("seed", [4, 5])
def test_as_of_seq_reproduces_earlier_answers(seed: int) -> None:
    world = random_world(seed, events=45)
    store = store_of(world)
    rt = KipRuntime(KipConfig(origin=ORIGIN), new_nexus(KipConfig(origin=ORIGIN).space_id), cursor_secret=b"c" * 32)
    then: dict[int, dict] = {}
    capsules: list[str] = []
    for record in world.records:
        follow(store, rt.nexus, max_records=1)
        if record.envelope.type == "knowledge.publish":
            capsules.append(record.envelope.id)
        seq = rt.nexus.head
        answers = {c: rt.meta(c) for c in COMMANDS}
        for pol in ("kip:structural", "akrelay:corroborated"):
            answers.update({(cap, pol): rt.project_capsule(cap, policy=pol) for cap in capsules})
        then[seq] = answers
    statuses_changed = False
    for seq, answers in then.items():
        for key, old in answers.items():
            if isinstance(key, tuple):
                now = rt.project_capsule(key[0], policy=key[1], as_of=seq)
                statuses_changed |= now["status"] != rt.project_capsule(key[0], policy=key[1])["status"]
            elif key.startswith("SEARCH"):
                now = rt.meta(key + f" AS OF SEQ {seq}")
            else:
                now = rt.meta(key.replace("DESCRIBE SNAPSHOT", f"DESCRIBE SNAPSHOT AS OF SEQ {seq}")
                              .replace("ENVIRONMENT", f"ENVIRONMENT AS OF SEQ {seq}"))
                if key == "DESCRIBE SNAPSHOT":
                    now = {**now, "head_seq": old["head_seq"]}
                else:
                    old = {**old, "as_of_seq": seq}
            assert now == old, (seq, key)
    assert statuses_changed, "the log should change at least one projection over time"


def test_element_views_as_of(world: World) -> None:
    cap = world.publish("alice")
    world.retract("alice", cap.id)
    rt = KipRuntime(KipConfig(origin=ORIGIN), world.nexus())
    (assertion,) = rt.nexus.assertions_on(rt.nexus.holds(cap.id).id)
    then, now = rt.element(assertion.id, as_of=1), rt.element(assertion.id)
    assert then["lifecycle"]["status"] == "active" and now["lifecycle"]["status"] == "retracted"
    assert then["_system"]["version"] == 1 and now["_system"]["version"] == 2
    assert now["_system"]["updated_tx"] == "tx-2"
    with pytest.raises(Exception) as exc:
        rt.element(assertion.id, as_of=0)
    assert exc.value.code == "NotFoundOrNotVisible"
