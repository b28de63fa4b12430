"""Candidate planning: tag constraints reach the tag index without changing any result (issue 13).

A Concept pattern's own ``{attributes: {tags: [...]}}`` and the tags a later Concept
pattern of the same block requires of a variable that a Structural pattern binds are
answered from the nexus's tag index (``concepts_tagged``). The rows must be exactly those
of the unplanned evaluation (a ``FILTER(true)`` between the clauses stops the look-ahead)
and of a plain Python scan, at every snapshot, on both backends.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from akrelay.kip.elements import Concept

from .fixtures import Log, kql, rows

ACTORS = ["ann", "ben", "cat"]
TAGS = ["red", "green", "blue", "cache", "x.y-z"]

BY_ACTOR_AND_TAG = ('FIND(?c.name) WHERE {{ ?a {{type: "Agent", key: :actor}} STRUCTURAL (?c, "ak_published_by", ?a) '
                    '{barrier}?c {{attributes: {{tags: [:tag]}}}} }}{as_of} ORDER BY ?c.name')
ANY_EDGE_AND_TAG = ('FIND(?c.name, ?a.key) WHERE {{ STRUCTURAL (?c, "ak_published_by", ?a) '
                    '{barrier}?c {{type: "KnowledgeCapsule", attributes: {{tags: [:tag]}}}} }}{as_of}')
TWO_TAGS = 'FIND(?c.name) WHERE {{ ?c {{type: "KnowledgeCapsule", attributes: {{tags: [:tag, :other]}}}} }}{as_of}'
TAG_ONLY = "FIND(?c.name, ?c.attributes.tags) WHERE {{ ?c {{attributes: {{tags: [:tag]}}}} }}{as_of}"


def _log(seed: int) -> tuple[Log, list[tuple[str, str, list[str]]]]:
    rng = random.Random(seed)
    log = Log()
    published: list[tuple[str, str, list[str]]] = []
    for n in range(30):
        actor = rng.choice(ACTORS)
        tags = rng.sample(TAGS, rng.randint(0, 3))
        relations = [("extends", rng.choice(published)[1])] if published and rng.random() < 0.3 else None
        published.append((actor, log.publish(actor, f"Capsule {n:02d}", tags=tags, relations=relations), tags))
        if rng.random() < 0.3:
            log.assess(rng.choice(ACTORS), rng.choice(published)[1], "supports")
    return log, published


def _names(result: list[list[Any]]) -> list[str]:
    return sorted(r[0] for r in result)


@pytest.mark.parametrize("seed", [1, 2])
def test_tag_constraints_give_the_rows_of_the_unplanned_query_at_every_seq(seed: int) -> None:
    log, published = _log(seed)
    rt = log.runtime()
    head = len(log.records)
    for seq in (3, head // 2, head):
        visible = [(a, cid, tags) for a, cid, tags in published
                   if next(r.seq for r in log.records if r.envelope.id == cid) <= seq]
        of = {cid: log.records[[r.envelope.id for r in log.records].index(cid)].envelope.payload["title"]
              for _, cid, _ in published}
        as_of = f" AS OF SEQ {seq}" if seq != head else ""
        for tag in TAGS + ["absent"]:
            for actor in ACTORS:
                params = {"actor": log.did(actor), "tag": tag}
                planned = rows(rt, BY_ACTOR_AND_TAG.format(barrier="", as_of=as_of), **params)
                unplanned = rows(rt, BY_ACTOR_AND_TAG.format(barrier="FILTER(true) ", as_of=as_of), **params)
                expected = sorted(of[cid] for a, cid, tags in visible if a == actor and tag in tags)
                assert planned == unplanned and [r[0] for r in planned] == expected, (seq, actor, tag)
            planned = rows(rt, ANY_EDGE_AND_TAG.format(barrier="", as_of=as_of), tag=tag)
            assert planned == rows(rt, ANY_EDGE_AND_TAG.format(barrier="FILTER(true) ", as_of=as_of), tag=tag)
            assert sorted((n, k) for n, k in planned) == sorted(
                (of[cid], log.did(a)) for a, cid, tags in visible if tag in tags)
            got = rows(rt, TAG_ONLY.format(as_of=as_of), tag=tag)
            assert _names(got) == sorted(of[cid] for _, cid, tags in visible if tag in tags)
            assert all(tag in t for _, t in got)
            for other in TAGS:
                both = rows(rt, TWO_TAGS.format(as_of=as_of), tag=tag, other=other)
                assert _names(both) == sorted(of[cid] for _, cid, tags in visible if tag in tags and other in tags)


def test_a_tag_constraint_is_an_index_intersection_not_an_enumeration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planned shapes never enumerate an actor's capsules, a type or every Concept."""
    log, published = _log(3)
    rt = log.runtime()
    actor, _, tags = next(p for p in published if p[2])

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("enumerated instead of intersecting indexes")

    expected = rows(rt, BY_ACTOR_AND_TAG.format(barrier="FILTER(true) ", as_of=""), actor=log.did(actor), tag=tags[0])
    assert expected
    for name in ("structural_sources", "concepts_of_type", "of_kind"):
        monkeypatch.setattr(rt.nexus, name, refuse)
    assert rows(rt, BY_ACTOR_AND_TAG.format(barrier="", as_of=""), actor=log.did(actor), tag=tags[0]) == expected
    assert rows(rt, TWO_TAGS.format(as_of=""), tag=tags[0], other=tags[0])
    assert rows(rt, TAG_ONLY.format(as_of=""), tag=tags[0])
    with pytest.raises(AssertionError, match="enumerated"):  # the barrier still enumerates: the check is real
        rows(rt, BY_ACTOR_AND_TAG.format(barrier="FILTER(true) ", as_of=""), actor=log.did(actor), tag=tags[0])


def test_a_non_string_tag_value_matches_nothing_and_uses_no_index() -> None:
    log, _ = _log(4)
    rt = log.runtime()
    assert rows(rt, TAG_ONLY.format(as_of=""), tag=7) == []
    assert rows(rt, TAG_ONLY.format(as_of=""), tag=None) == []
    every = [e for e in rt.nexus.all_elements() if isinstance(e, Concept) and e.attributes.get("tags")]
    assert every  # the log has tagged capsules, so the empty answers above are answers


BY_AUTHOR = ('FIND(?x.stance, ?x.id) WHERE {{ ?g {{type: "Agent", key: :actor}} '
             '?x ASSERTION {{asserted_by: ?g{more}}} {barrier}}}{as_of} LIMIT {limit}{cursor}')


def _pages(rt: Any, actor: str, limit: int, **fmt: str) -> list[list[list[Any]]]:
    """Every page of ``BY_AUTHOR``, following ``next_cursor`` to the end."""
    pages, cursor = [], None
    for _ in range(100):
        command = BY_AUTHOR.format(limit=limit, cursor=" CURSOR :c" if cursor else "", **fmt)
        result = kql(rt, command, actor=actor, **({"c": cursor} if cursor else {}))["result"]
        pages.append(result["rows"])
        cursor = result.get("next_cursor")
        if cursor is None:
            return pages
    raise AssertionError("pages never ended")


@pytest.mark.parametrize("limit", [1, 2, 5, 50])
def test_a_limit_without_order_by_gives_the_pages_of_the_whole_evaluation(limit: int) -> None:
    """Assertions by author, enumerated by id and stopped after the page: the same pages,
    cursors and ends as evaluating every solution (a trailing FILTER(true) stops the pushdown)."""
    log, published = _log(5)
    for n, (_, cid, _) in enumerate(published[:12]):
        log.assess("ann", cid, "supports" if n % 3 else "challenges")
    rt = log.runtime()
    head = len(log.records)
    for actor in ACTORS:
        for seq in (head // 3, head):
            as_of = f" AS OF SEQ {seq}" if seq != head else ""
            for more in ("", ', stance: "supports"'):
                planned = _pages(rt, log.did(actor), limit, more=more, barrier="", as_of=as_of)
                whole = _pages(rt, log.did(actor), limit, more=more, barrier="FILTER(true) ", as_of=as_of)
                assert planned == whole, (actor, seq, more)
                assert sum(len(p) for p in planned) == len({r[1] for p in planned for r in p})


def test_a_page_without_order_by_stops_reading_after_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    log, published = _log(6)
    for _, cid, _ in published[:20]:
        log.assess("ann", cid, "supports")
    rt = log.runtime()
    ann = log.did("ann")
    pulled: list[str] = []
    real = rt.nexus.assertions_by

    def counting(*args: Any, **kwargs: Any) -> Any:
        for assertion in real(*args, **kwargs):
            pulled.append(assertion.id)
            yield assertion

    monkeypatch.setattr(rt.nexus, "assertions_by", counting)
    everything = kql(rt, BY_AUTHOR.format(limit=50, cursor="", more="", barrier="", as_of=""), actor=ann)
    assert len(everything["result"]["rows"]) > 20 and len(pulled) > 20
    pulled.clear()
    first = kql(rt, BY_AUTHOR.format(limit=3, cursor="", more="", barrier="", as_of=""), actor=ann)
    assert len(first["result"]["rows"]) == 3 and "next_cursor" in first["result"]
    assert len(pulled) == 4  # the page and one more, to know that more follow
