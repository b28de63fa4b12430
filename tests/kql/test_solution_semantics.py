"""§42.4–§42.5 and §44 solution processing, one rule per test."""

from __future__ import annotations

import pytest

from .fixtures import Log, kql, rows


@pytest.fixture
def world():
    log = Log()
    a1 = log.publish("alice", "Same name", tags=["x", "y"])
    a2 = log.publish("bob", "Same name", tags=["y"])
    b = log.publish("bob", "Other", relations=[("extends", a1)])
    return log, log.runtime(), {"a1": a1, "a2": a2, "b": b}


def test_same_display_name_stays_two_solutions(world) -> None:
    _, rt, _ = world
    assert rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: "Same name"} }') == \
        [["Same name"], ["Same name"]]


def test_union_dedups_identical_complete_solutions(world) -> None:
    _, rt, ids = world
    found = rows(rt, 'FIND(?c.key) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
                     'UNION { ?c {type: "KnowledgeCapsule", key: :k} } }', k=ids["a1"])
    assert found == [[ids["a1"]]]


def test_unprojected_bindings_keep_solutions_distinct(world) -> None:
    _, rt, ids = world
    # two tags of one capsule: FIND does not mention ?t, the rows stay two (no implicit DISTINCT)
    found = rows(rt, 'FIND(?c.key) WHERE { ?c {type: "KnowledgeCapsule", key: :k, attributes: {tags: [?t]}} }',
                 k=ids["a1"])
    assert found == [[ids["a1"]], [ids["a1"]]]
    assert rows(rt, 'FIND(COUNT(DISTINCT ?c.key), COUNT(?t)) WHERE { ?c {type: "KnowledgeCapsule", key: :k, '
                    'attributes: {tags: [?t]}} }', k=ids["a1"]) == [[1, 2]]


def test_union_right_branch_does_not_inherit_bindings(world) -> None:
    _, rt, ids = world
    # ?c bound on the left does not constrain the right branch's ?c
    found = rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
                     'UNION { ?c {type: "KnowledgeCapsule", name: "Other"} } } ORDER BY ?c.name', k=ids["a2"])
    assert found == [["Other"], ["Same name"]]


def test_filter_inside_optional_differs_from_filter_after(world) -> None:
    _, rt, _ = world
    inside = rows(rt, 'FIND(?c.name, ?t.name) WHERE { ?c {type: "KnowledgeCapsule"} '
                      'OPTIONAL { (?c, "ak_extends", ?t) FILTER(?t.name == "nope") } } ORDER BY ?c.name')
    after = rows(rt, 'FIND(?c.name, ?t.name) WHERE { ?c {type: "KnowledgeCapsule"} '
                     'OPTIONAL { (?c, "ak_extends", ?t) } FILTER(?t.name == "nope") }')
    assert [r[1] for r in inside] == [None, None, None] and after == []


def test_optional_partial_match_does_not_leak(world) -> None:
    _, rt, _ = world
    found = rows(rt, 'FIND(?c.name, ?t) WHERE { ?c {type: "KnowledgeCapsule", name: "Other"} '
                     'OPTIONAL { (?c, "ak_extends", ?t) (?t, "ak_extends", ?u) } }')
    assert found == [["Other", None]]


def test_later_pattern_binds_an_optional_miss(world) -> None:
    _, rt, ids = world
    found = rows(rt, 'FIND(?c.name, ?t.key) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
                     'OPTIONAL { (?c, "ak_extends", ?t) } ?t {type: "KnowledgeCapsule", key: :a} }',
                 k=ids["a2"], a=ids["a1"])
    assert found == [["Same name", ids["a1"]]]


def test_not_keeps_incoming_bindings_and_hides_locals(world) -> None:
    _, rt, ids = world
    found = rows(rt, 'FIND(?c.key) WHERE { ?c {type: "KnowledgeCapsule"} NOT { (?c, "ak_extends", ?t) } } '
                     "ORDER BY ?c.key")
    assert sorted(r[0] for r in found) == sorted([ids["a1"], ids["a2"]])


def test_three_valued_filter(world) -> None:
    _, rt, _ = world
    base = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} OPTIONAL { (?c, "ak_extends", ?t) } FILTER(%s) }'
    assert len(rows(rt, base % '?t.name == "x"')) == 0               # unknown for the two misses, false for one
    assert len(rows(rt, base % '!(?t.name == "x")')) == 1            # !unknown stays unknown
    assert len(rows(rt, base % '?t.name == "x" || true')) == 3       # unknown || true
    assert len(rows(rt, base % '?t.name == "x" && false')) == 0      # unknown && false
    assert len(rows(rt, base % 'IS_NULL(?t) || ?t.name != "x"')) == 3


def test_functions(world) -> None:
    _, rt, _ = world
    q = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} FILTER(%s) } ORDER BY ?c.name'
    assert rows(rt, q % 'IN(?c.name, ["Other", "Nope"])') == [["Other"]]
    assert rows(rt, q % 'IN(?c.name, [])') == []
    assert len(rows(rt, q % 'CONTAINS(?c.name, "ame")')) == 2
    assert rows(rt, q % 'STARTS_WITH(?c.name, "Oth") && ENDS_WITH(?c.name, "her")') == [["Other"]]
    assert rows(rt, q % 'REGEX(?c.name, "^O.h")') == [["Other"]]
    assert len(rows(rt, q % 'IS_ELEMENT(?c) && IS_KIND(?c, "concept") && !IS_LITERAL(?c)')) == 3
    assert len(rows(rt, q % 'LITERAL_TYPE(?c.name) == "string" && LITERAL_TYPE(?c.attributes.tags) == "array"')) == 3
    assert len(rows(rt, q % 'IS_NOT_NULL(?c.attributes.statement)')) == 3


def test_find_layout_and_null_cells(world) -> None:
    _, rt, _ = world
    out = kql(rt, 'FIND(?c.name, ?t.name, ?c.attributes["tags"]) WHERE { ?c {type: "KnowledgeCapsule", name: "Other"} '
                  'OPTIONAL { (?c, "ak_supports", ?t) } }')
    assert out["result"]["columns"] == ["?c.name", "?t.name", "?c.attributes.tags"]
    assert out["result"]["rows"] == [["Other", None, []]]
    assert out["context"]["snapshot_seq"] == 3
