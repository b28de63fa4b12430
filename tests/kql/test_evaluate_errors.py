"""Evaluation-time error paths: errors are raised even where no solution reaches them."""

from __future__ import annotations

import pytest

from akrelay.kip.errors import KipError

from .fixtures import Log, kql, rows


@pytest.fixture
def rt():
    log = Log()
    cap = log.publish("alice", "Claim", tags=["t"])
    log.assess("bob", cap, "supports")
    return log.runtime()


def code(rt, command: str, **params) -> str:
    with pytest.raises(KipError) as info:
        kql(rt, command, **params)
    return info.value.code


EMPTY = '?x {type: "Agent", key: "did:agent:nobody"} '


@pytest.mark.parametrize(("tail", "params", "expected"), [
    ('(?x, "no_such_predicate", ?y)', {}, "SchemaSymbolNotFound"),
    ('?y {type: "NoSuchType"}', {}, "SchemaSymbolNotFound"),
    ('STRUCTURAL (?x, "no_field", ?y)', {}, "SchemaSymbolNotFound"),
    ('OPTIONAL { (?x, :p, ?y) }', {"p": "nope"}, "SchemaSymbolNotFound"),
    ('FILTER(REGEX(?x.name, :re))', {"re": "(a)\\1"}, "InvalidSyntax"),  # RE2 has no backreferences
    ('FILTER(REGEX(?x.name, :re))', {"re": 5}, "TypeMismatch"),
    ('FILTER(IN(?x.name, :list))', {"list": "a"}, "TypeMismatch"),
    ('?h SEARCH CONCEPT "a" MODE :m LIMIT 3', {"m": "hybrid"}, "SearchModeUnsupported"),
    ('?h SEARCH CONCEPT "a" THRESHOLD :t LIMIT 3', {"t": 2}, "ConstraintViolation"),
    ('?h SEARCH CONCEPT "a" LIMIT :k', {"k": -1}, "ConstraintViolation"),
    ('?h SEARCH ACTIVITY "a" LIMIT 3', {}, "SearchIndexUnavailable"),
])
def test_static_errors_even_in_an_empty_branch(rt, tail: str, params: dict, expected: str) -> None:
    assert code(rt, f"FIND(?x) WHERE {{ {EMPTY}{tail} }}", **params) == expected


def test_unknown_parameter_is_reference_error_naming_all_missing(rt) -> None:
    with pytest.raises(KipError) as info:
        kql(rt, "FIND(?x) WHERE { ?x {key: :a, name: :b} } LIMIT :c")
    assert info.value.code == "ReferenceError"
    assert info.value.details["missing"] == ["a", "b", "c"]


def test_explicit_null_parameter_is_a_value(rt) -> None:
    assert rows(rt, "FIND(?x) WHERE { ?x {type: \"Agent\", name: :n} }", n=None) == []


def test_belief_on_optional_unbound_proposition_fails_explicitly(rt) -> None:
    assert code(rt, 'FIND(?b) WHERE { ?a {type: "Agent"} OPTIONAL { ?p (?a, "ak_holds", true) } ?b BELIEF (?p) }') \
        == "ProjectionTargetUnbound"


def test_open_path_beyond_the_hop_limit_is_resource_exhausted(monkeypatch) -> None:
    from akrelay.kip.kql import evaluate

    log = Log()
    previous = log.publish("alice", "c0")
    for i in range(1, 6):
        previous = log.publish("alice", f"c{i}", relations=[("extends", previous)])
    rt = log.runtime()
    found = rows(rt, 'FIND(COUNT(?y)) WHERE { ?x {type: "KnowledgeCapsule", name: "c5"} (?x, "ak_extends"{1,}, ?y) }')
    assert found == [[5]]
    monkeypatch.setitem(evaluate.LIMITS, "max_path_hops", 3)
    assert code(rt, 'FIND(?y) WHERE { ?x {type: "KnowledgeCapsule", name: "c5"} (?x, "ak_extends"{1,}, ?y) }') \
        == "ResourceExhausted"
    # a bounded path within the limit is answered
    assert rows(rt, 'FIND(?y.name) WHERE { ?x {type: "KnowledgeCapsule", name: "c5"} (?x, "ak_extends"{2}, ?y) }') \
        == [["c3"]]
    # zero hops include the reflexive match
    assert rows(rt, 'FIND(?y.name) WHERE { ?x {type: "KnowledgeCapsule", name: "c1"} (?x, "ak_extends"{0,1}, ?y) } '
                    "ORDER BY ?y.name") == [["c0"], ["c1"]]


def test_solution_cap_is_resource_exhausted(monkeypatch, rt) -> None:
    from akrelay.kip.kql import evaluate

    monkeypatch.setitem(evaluate.LIMITS, "max_solutions", 3)
    assert code(rt, "FIND(?x, ?y) WHERE { ?x {} ?y {} }") == "ResourceExhausted"


def test_cursor_expiry_and_snapshot(rt) -> None:
    from akrelay.kip.kql.evaluate import run

    from .fixtures import NOW

    page = run(rt, "FIND(?x) WHERE { ?x {} } LIMIT 1", {}, now_ms=NOW)["result"]
    late = NOW + 16 * 60 * 1000
    with pytest.raises(KipError) as info:
        run(rt, "FIND(?x) WHERE { ?x {} } LIMIT 1 CURSOR :c", {"c": page["next_cursor"]}, now_ms=late)
    assert info.value.code == "CursorExpired" and info.value.details["reason"] == "expired"


def test_aggregate_type_errors(rt) -> None:
    assert code(rt, "FIND(SUM(?x.name)) WHERE { ?x {} }") == "TypeMismatch"
    assert code(rt, "FIND(MAX(?x._system.space_seq), MIN(?x)) WHERE { ?x {} }") == "TypeMismatch"
    assert rows(rt, 'FIND(SUM(?x._system.space_seq), AVG(?x._system.space_seq), MIN(?x.name), COUNT(?x)) '
                    'WHERE { ?x {type: "KnowledgeCapsule"} }') == [[1, 1, "Claim", 1]]
    assert rows(rt, 'FIND(SUM(?x._system.space_seq), MAX(?x.name), COUNT(?x)) WHERE { ?x {type: "Agent", key: "no"} }') \
        == [[None, None, 0]]
    assert rows(rt, 'FIND(?x.name, COUNT(?x)) WHERE { ?x {type: "Agent", key: "no"} }') == []


def test_no_limit_result_cap_is_disclosed(monkeypatch, rt) -> None:
    from akrelay.kip.kql import evaluate

    monkeypatch.setitem(evaluate.LIMITS, "result_cap", 2)
    result = kql(rt, "FIND(?x) WHERE { ?x {} }")["result"]
    assert result["truncated"] is True and result["result_cap"] == 2 and result["next_cursor"]
    assert result["row_count"] == 2


def test_limit_zero_returns_no_rows(rt) -> None:
    result = kql(rt, "FIND(?x) WHERE { ?x {} } LIMIT 0")["result"]
    assert result["rows"] == [] and "next_cursor" in result


def test_unanchored_path_start_cap_is_resource_exhausted(monkeypatch, rt) -> None:
    from akrelay.kip.kql import evaluate

    monkeypatch.setitem(evaluate.LIMITS, "max_path_visits", 1)
    assert code(rt, 'FIND(?x, ?y) WHERE { (?x, "ak_extends"{0,2}, ?y) }') == "ResourceExhausted"


def test_withheld_capsule_content_is_not_matchable() -> None:
    """Operator withholding is read-time visibility: KQL sees the redacted view only."""
    log = Log()
    secret = log.publish("alice", "Withheld title", tags=["hidden-tag"])
    log.publish("alice", "Public title", tags=["hidden-tag"])
    rt = log.runtime()
    query = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", attributes: {tags: ["hidden-tag"]}} } ORDER BY ?c.name'
    assert rows(rt, query) == [["Public title"], ["Withheld title"]]
    rt.nexus.withheld = lambda event_id: event_id == secret
    assert rows(rt, query) == [["Public title"]]
    assert rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: "Withheld title"} }') == []
    assert rows(rt, 'FIND(?c.name, ?c.attributes) WHERE { ?c {type: "KnowledgeCapsule", key: :k} }', k=secret) \
        == [[secret, {}]]
    assert rows(rt, 'FIND(?h) WHERE { ?h SEARCH CONCEPT "withheld" LIMIT 5 }') == []
