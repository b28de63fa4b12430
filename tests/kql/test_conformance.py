"""KIP 2.0 conformance vectors that apply to a read-only KQL/META runtime.

Each test is named after its vector in
``reference/kip/conformance/KIP-2.0-Conformance-Tests.md``; nexus state is seeded
from signed agent-knowledge events (``fixtures.Log``). Where the prose (an older
revision) and the KIP 2.0 seed disagree, the seed governs; where a vector needs
state an imported nexus cannot hold (functional predicates, valid times,
hypothetical or predicted modes), the test checks the adapted property and
``docs/conformance.md`` says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from akrelay.kip import import_record
from akrelay.kip.errors import KipError
from akrelay.kip.kql.evaluate import execute_kql
from akrelay.store.base import Record

from .fixtures import NOW, Log, kql, request, rows

HOLDS = "kip://akrelay/agent-knowledge@1.0.0/ak_holds"


def err(rt, command: str, **params) -> KipError:
    with pytest.raises(KipError) as info:
        kql(rt, command, **params)
    return info.value


@pytest.fixture
def log() -> Log:
    return Log()


@pytest.fixture
def scene(log: Log):
    """alice publishes A (supported by bob, challenged by carol) and B (extends A);
    dave publishes a question Q; bob publishes C (a hypothesis)."""
    a = log.publish("alice", "Water boils at 100 C", tags=["physics", "water"])
    b = log.publish("alice", "Ice melts at 0 C", tags=["physics"], relations=[("extends", a)])
    q = log.publish("dave", "Why is the sky blue", kind="question")
    c = log.publish("bob", "Clouds are mostly ice", kind="hypothesis", tags=["weather"])
    log.assess("bob", a, "supports")
    log.assess("carol", a, "challenges")
    return {"A": a, "B": b, "Q": q, "C": c}


# ============================================================================ KQL suite


def test_KIP2_KQL_001_concept_pattern_works(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(?a) WHERE { ?a {type: "Agent", key: :did} }', did=log.did("alice"))
    assert len(found) == 1
    assert found[0][0]["kind"] == "concept" and found[0][0]["key"] == log.did("alice")
    assert rows(rt, 'FIND(?a) WHERE { ?a CONCEPT {type: "Agent", key: "did:agent:nobody"} }') == []


def test_KIP2_KQL_002_proposition_pattern_reads_raw_state(log: Log, scene) -> None:
    rt = log.runtime()
    # Q (a question) has no Assertion at all, A is contested: both raw Propositions exist.
    found = rows(rt, 'FIND(?c.name, ?p.id) WHERE { ?c {type: "KnowledgeCapsule"} ?p (?c, "ak_holds", true) } '
                     'ORDER BY ?c.name')
    assert [r[0] for r in found] == ["Clouds are mostly ice", "Ice melts at 0 C", "Water boils at 100 C",
                                     "Why is the sky blue"]
    belief = rows(rt, 'FIND(?b.status) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?b BELIEF (?c, "ak_holds", true) }',
                  k=scene["Q"])
    assert belief == [["insufficient"]]  # raw existence is not acceptance


def test_KIP2_KQL_003_predicate_variable_returns_exact_ref(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(?pred) WHERE { ?c {type: "KnowledgeCapsule", key: :k} (?c, ?pred, ?o) } ORDER BY ?pred',
                 k=scene["B"])
    assert found == [["kip://akrelay/agent-knowledge@1.0.0/ak_extends"], [HOLDS]]
    # the bound exact ref unifies with another pattern naming the same Predicate by its local name
    assert rows(rt, 'FIND(?pred) WHERE { ?c {type: "KnowledgeCapsule", key: :k} (?c, ?pred, true) '
                    '(?c, "ak_holds", true) }', k=scene["B"]) == [[HOLDS]]


def test_KIP2_KQL_004_assertion_pattern_works(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(?a.stance, ?a.mode, ?who.key) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
                     '?p (?c, "ak_holds", true) ?who {type: "Agent", key: :bob} '
                     '?a ASSERTION {proposition: ?p, asserted_by: ?who, stance: "support", mode: "imported"} }',
                 k=scene["A"], bob=log.did("bob"))
    assert found == [["support", "imported", log.did("bob")]]


def test_KIP2_KQL_005_evidence_pattern_works(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(COUNT(?e)) WHERE { ?e EVIDENCE {evidence_class: "agent_statement"} }')
    assert found == [[len(log.records)]]
    one = rows(rt, 'FIND(?e.client_key) WHERE { ?e EVIDENCE {client_key: :ck} }', ck="ak:" + scene["A"])
    assert one == [["ak:" + scene["A"]]]


def test_KIP2_KQL_006_activity_pattern_works(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(COUNT(?x)) WHERE { ?x ACTIVITY {activity_class: "import", status: "completed"} }')
    assert found == [[len(log.records)]]
    assert rows(rt, 'FIND(?x) WHERE { ?x ACTIVITY {activity_class: "inference"} }') == []


def test_KIP2_KQL_007_structural_pattern_works(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(?e, ?author.key) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
                     '?e STRUCTURAL (?c, "ak_published_by", ?author) }', k=scene["B"])
    assert len(found) == 1
    edge, author = found[0]
    assert edge["kind"] == "structural" and edge["field"].endswith("/ak_published_by")
    assert author == log.did("alice")
    # no semantic Proposition backs the edge
    with pytest.raises(KipError) as info:
        kql(rt, 'FIND(?p) WHERE { ?p (?c, "ak_published_by", ?a) }')
    assert info.value.code == "SchemaSymbolNotFound"


def test_KIP2_KQL_008_filter_comparison_works(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} '
                     'FILTER(?c.name >= "I" && ?c.name < "W" || ?c.name == "Why is the sky blue") } ORDER BY ?c.name')
    assert found == [["Ice melts at 0 C"], ["Why is the sky blue"]]
    # no coercion: a string never compares with a number
    assert rows(rt, 'FIND(?c) WHERE { ?c {type: "KnowledgeCapsule"} FILTER(?c.name > 1) }') == []


def test_KIP2_KQL_009_not_is_no_visible_match_not_false(log: Log, scene) -> None:
    rt = log.runtime()
    before = rt.nexus.fingerprint()
    found = rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} ?p (?c, "ak_holds", true) '
                     'NOT { ?a ASSERTION {proposition: ?p, stance: "reject"} } } ORDER BY ?c.name')
    assert [r[0] for r in found] == ["Clouds are mostly ice", "Ice melts at 0 C", "Why is the sky blue"]
    assert rt.nexus.fingerprint() == before  # no reject Assertion or belief was created


def test_KIP2_KQL_010_optional_missing_is_null(log: Log, scene) -> None:
    rt = log.runtime()
    before = rt.nexus.fingerprint()
    found = rows(rt, 'FIND(?c.name, ?t.name) WHERE { ?c {type: "KnowledgeCapsule"} '
                     'OPTIONAL { (?c, "ak_extends", ?t) } } ORDER BY ?c.name')
    assert found == [["Clouds are mostly ice", None], ["Ice melts at 0 C", "Water boils at 100 C"],
                     ["Water boils at 100 C", None], ["Why is the sky blue", None]]
    assert rt.nexus.fingerprint() == before


def test_KIP2_KQL_011_union_combines_branches(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(?q.name, ?h.name) WHERE { ?q {type: "KnowledgeCapsule", key: :q} '
                     'UNION { ?h {type: "KnowledgeCapsule", key: :h} } } ORDER BY ?q.name',
                 q=scene["Q"], h=scene["C"])
    assert found == [["Why is the sky blue", None], [None, "Clouds are mostly ice"]]
    # the right branch still contributes when the left has no solutions
    assert rows(rt, 'FIND(?h.name) WHERE { ?q {type: "KnowledgeCapsule", key: "none"} '
                    'UNION { ?h {type: "KnowledgeCapsule", key: :h} } }', h=scene["C"]) == [["Clouds are mostly ice"]]


def test_KIP2_KQL_013_count_zero_is_not_negative_belief(log: Log, scene) -> None:
    rt = log.runtime()
    zero = rows(rt, 'FIND(COUNT(?a)) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?p (?c, "ak_holds", true) '
                    '?a ASSERTION {proposition: ?p} }', k=scene["Q"])
    assert zero == [[0]]
    belief = rows(rt, 'FIND(?b.status) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?b BELIEF (?c, "ak_holds", true) }',
                  k=scene["Q"])
    assert belief == [["insufficient"]]


def test_KIP2_KQL_014_order_by_honors_explicit_key(log: Log, scene) -> None:
    rt = log.runtime()
    asc = [r[0] for r in rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} } ORDER BY ?c.name ASC')]
    desc = [r[0] for r in rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} } ORDER BY ?c.name DESC')]
    assert asc == sorted(asc) and desc == sorted(asc, reverse=True)
    by_seq = rows(rt, 'FIND(?c.name, ?c._system.space_seq) WHERE { ?c {type: "KnowledgeCapsule"} } '
                      'ORDER BY ?c._system.space_seq DESC')
    assert [r[1] for r in by_seq] == [4, 3, 2, 1]


def test_KIP2_KQL_015_null_sort_keys_order_last(log: Log, scene) -> None:
    rt = log.runtime()
    for direction in ("ASC", "DESC"):
        found = rows(rt, 'FIND(?c.name, ?t.name) WHERE { ?c {type: "KnowledgeCapsule"} '
                         f'OPTIONAL {{ (?c, "ak_extends", ?t) }} }} ORDER BY ?t.name {direction}, ?c.name')
        assert found[0] == ["Ice melts at 0 C", "Water boils at 100 C"], direction
        assert [r[1] for r in found[1:]] == [None, None, None]
        assert [r[0] for r in found[1:]] == ["Clouds are mostly ice", "Water boils at 100 C", "Why is the sky blue"]


def test_KIP2_KQL_016_kql_cursor_pins_snapshot(log: Log, scene) -> None:
    rt = log.runtime()
    command = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} } ORDER BY ?c.name LIMIT 2 CURSOR :c'
    first = kql(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} } ORDER BY ?c.name LIMIT 2')
    pinned = first["context"]["snapshot_seq"]
    log.publish("erin", "A new capsule sorting first")  # commit a new matching row
    log.extend(rt)
    assert rt.nexus.head == pinned + 1
    second = kql(rt, command, c=first["result"]["next_cursor"])
    assert second["context"]["snapshot_seq"] == pinned
    names = [r[0] for r in first["result"]["rows"] + second["result"]["rows"]]
    assert names == ["Clouds are mostly ice", "Ice melts at 0 C", "Water boils at 100 C", "Why is the sky blue"]
    assert "next_cursor" not in second["result"]
    fresh = [r[0] for r in rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} } ORDER BY ?c.name')]
    assert "A new capsule sorting first" in fresh


def test_KIP2_KQL_017_cursor_query_mismatch_fails(log: Log, scene) -> None:
    rt = log.runtime()
    page = kql(rt, 'FIND(?c.name) WHERE { ?c {type: :t} } ORDER BY ?c.name LIMIT 1', t="KnowledgeCapsule")
    cursor = page["result"]["next_cursor"]
    changed_query = err(rt, 'FIND(?c.key) WHERE { ?c {type: :t} } ORDER BY ?c.name LIMIT 1 CURSOR :c',
                        t="KnowledgeCapsule", c=cursor)
    changed_param = err(rt, 'FIND(?c.name) WHERE { ?c {type: :t} } ORDER BY ?c.name LIMIT 1 CURSOR :c',
                        t="Agent", c=cursor)
    assert changed_query.code == changed_param.code == "CursorMismatch"
    # whitespace and comments are not a different query
    ok = kql(rt, 'FIND(?c.name)\n WHERE { ?c {type: :t} } // same\n ORDER BY ?c.name LIMIT 1 CURSOR :c',
             t="KnowledgeCapsule", c=cursor)
    assert ok["result"]["rows"] == [["Ice melts at 0 C"]]


def test_KIP2_KQL_018_cursor_type_mismatch_fails(log: Log, scene) -> None:
    rt = log.runtime()
    kql_cursor = kql(rt, 'FIND(?c) WHERE { ?c {type: "KnowledgeCapsule"} } LIMIT 1')["result"]["next_cursor"]
    response = request(rt, {"command": 'SEARCH CONCEPT "water" LIMIT 1 CURSOR :c', "parameters": {"c": kql_cursor}})
    assert response["results"][0]["error"]["code"] == "CursorTypeMismatch"
    response = request(rt, {"command": "LIST TYPES LIMIT 1 CURSOR :c", "parameters": {"c": kql_cursor}})
    assert response["results"][0]["error"]["code"] == "CursorTypeMismatch"


def test_KIP2_KQL_019_belief_result_is_virtual(log: Log, scene) -> None:
    rt = log.runtime()
    before, head = rt.nexus.fingerprint(), rt.nexus.head
    for _ in range(3):
        found = rows(rt, 'FIND(?b) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?b BELIEF (?c, "ak_holds", true) }',
                     k=scene["A"])
        assert found[0][0]["status"] == "contested"
    assert rt.nexus.fingerprint() == before and rt.nexus.head == head


def test_KIP2_KQL_020_belief_target_is_bounded(log: Log, scene) -> None:
    rt = log.runtime()
    assert err(rt, "FIND(?b) WHERE { ?b BELIEF (?p) }").code == "ProjectionTargetUnbound"
    # bound, but to a Concept rather than a Proposition
    assert err(rt, 'FIND(?b) WHERE { ?p {type: "Agent"} ?b BELIEF (?p) }').code == "ProjectionTargetUnbound"
    assert err(rt, 'FIND(?b) WHERE { ?b BELIEF (?s, "ak_holds", ?o) }').code == "ProjectionTargetUnbounded"
    assert err(rt, 'FIND(?b) WHERE { ?b BELIEF SLOT (?s, "ak_holds") }').code == "ProjectionTargetUnbounded"


def test_KIP2_KQL_021_belief_slot_empty_is_insufficient(log: Log, scene) -> None:
    rt = log.runtime()
    found = rows(rt, 'FIND(?s.status, ?s.accepted_values, ?s.basis.snapshot_seq) WHERE { '
                     '?c {type: "KnowledgeCapsule", key: :k} ?s BELIEF SLOT (?c, "ak_derived_from") }', k=scene["A"])
    assert found == [["insufficient", [], rt.nexus.head]]


def test_KIP2_KQL_022_belief_slot_is_conflict_aware(log: Log, scene) -> None:
    # akrelay predicates are non-functional (docs/conformance.md): the slot lists every candidate with
    # its own projection and never picks one arbitrarily.
    rt = log.runtime()
    d = log.publish("erin", "Derived twice", relations=[("derived_from", scene["A"]), ("derived_from", scene["B"])])
    log.assess("bob", d, "supports")
    log.extend(rt)
    slot = rows(rt, 'FIND(?s) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?s BELIEF SLOT (?c, "ak_derived_from") }',
                k=d)[0][0]
    assert len(slot["candidate_projections"]) == 2
    assert all("leading" in c for c in slot["candidate_projections"])
    assert slot["status"] == "uncertain"  # only the author supports the relations: uncorroborated
    assert slot["accepted_values"] == []
    assert slot["explanation"]["functional"] is False


def test_KIP2_KQL_023_raw_path_does_not_propagate_belief(log: Log, scene) -> None:
    rt = log.runtime()
    top = log.publish("erin", "Builds on ice", relations=[("extends", scene["B"])])
    log.extend(rt)
    reach = rows(rt, 'FIND(?y.name) WHERE { ?x {type: "KnowledgeCapsule", key: :k} (?x, "ak_extends"{2}, ?y) }', k=top)
    assert reach == [["Water boils at 100 C"]]
    belief = rows(rt, 'FIND(?b.status, ?b.proposition) WHERE { ?x {type: "KnowledgeCapsule", key: :k} '
                      '?y {type: "KnowledgeCapsule", key: :a} ?b BELIEF (?x, "ak_extends", ?y) }', k=top, a=scene["A"])
    assert belief == [["insufficient", None]]


def test_KIP2_KQL_024_as_of_reconstructs_old_state(log: Log, scene) -> None:
    rt = log.runtime()
    query = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} } AS OF SEQ :s ORDER BY ?c.name'
    assert kql(rt, query, s=1)["result"]["rows"] == [["Water boils at 100 C"]]
    at2 = kql(rt, query, s=2)
    assert at2["result"]["rows"] == [["Ice melts at 0 C"], ["Water boils at 100 C"]]
    assert at2["context"]["snapshot_seq"] == 2
    status = ('FIND(?b.status) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?b BELIEF (?c, "ak_holds", true) } '
              "AS OF SEQ :s")
    assert kql(rt, status, k=scene["A"], s=4)["result"]["rows"] == [["uncertain"]]   # author only
    assert kql(rt, status, k=scene["A"], s=5)["result"]["rows"] == [["accepted"]]    # + bob
    assert kql(rt, status, k=scene["A"], s=6)["result"]["rows"] == [["contested"]]   # + carol
    assert err(rt, query, s=99).code == "HistoricalSnapshotUnavailable"


def test_KIP2_KQL_025_as_of_reconstructs_lifecycle(log: Log) -> None:
    cap = log.publish("alice", "Claim")
    assessment = log.assess("bob", cap, "supports")   # seq 2: bob's Assertion is active
    log.retract("bob", assessment)                   # seq 3: bob retracts his assessment
    rt = log.runtime()
    query = ('FIND(?a.lifecycle.status) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?p (?c, "ak_holds", true) '
             '?who {type: "Agent", key: :bob} ?a ASSERTION {proposition: ?p, asserted_by: ?who} } AS OF SEQ :s')
    assert kql(rt, query, k=cap, bob=log.did("bob"), s=2)["result"]["rows"] == [["active"]]
    assert kql(rt, query, k=cap, bob=log.did("bob"), s=3)["result"]["rows"] == [["retracted"]]


def test_KIP2_KQL_026_for_time_recorded_without_changing_snapshot(log: Log, scene) -> None:
    rt = log.runtime()
    query = ('FIND(?b.status, ?b.basis.valid_at, ?b.basis.snapshot_seq) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
             '?b BELIEF (?c, "ak_holds", true) } FOR TIME :t')
    early = kql(rt, query, k=scene["A"], t="2020-01-01T00:00:00.000Z")
    late = kql(rt, query, k=scene["A"], t="2030-01-01T00:00:00.000Z")
    assert early["result"]["rows"] == [["contested", "2020-01-01T00:00:00.000Z", 6]]
    assert late["result"]["rows"] == [["contested", "2030-01-01T00:00:00.000Z", 6]]
    assert early["context"]["snapshot_seq"] == late["context"]["snapshot_seq"] == 6
    assert early["context"]["valid_time"] == "2020-01-01T00:00:00.000Z"
    assert err(rt, query, k=scene["A"], t="yesterday").code == "TypeMismatch"


def test_KIP2_KQL_029_kql_read_has_no_write_receipt(log: Log, scene) -> None:
    rt = log.runtime()
    head = rt.nexus.head
    response = request(rt, {"language": "KQL", "command": 'FIND(?c) WHERE { ?c {type: "KnowledgeCapsule"} }'})
    assert response["status"] == "succeeded" and response["receipt"] is None
    assert "receipt" not in response["results"][0]
    assert response["results"][0]["context"]["snapshot_seq"] == head == rt.nexus.head


# ======================================================================= Epistemic suite


def belief_of(rt, key: str, **extra) -> dict:
    tail = extra.pop("tail", "")
    return rows(rt, 'FIND(?b) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?b BELIEF (?c, "ak_holds", true) } '
                + tail, k=key, **extra)[0][0]


def test_KIP2_EPI_001_no_assertion_yields_insufficient(log: Log, scene) -> None:
    assert belief_of(log.runtime(), scene["Q"])["status"] == "insufficient"


def test_KIP2_EPI_002_absent_grounded_proposition_is_insufficient_without_creation(log: Log, scene) -> None:
    rt = log.runtime()
    props = rt.nexus.counts()["proposition"]
    b = rows(rt, 'FIND(?b) WHERE { ?c {type: "KnowledgeCapsule", key: :a} ?d {type: "KnowledgeCapsule", key: :q} '
                 '?b BELIEF (?c, "ak_contradicts", ?d) }', a=scene["A"], q=scene["Q"])[0][0]
    assert b["status"] == "insufficient" and b["proposition"] is None and b["proposition_id"] is None
    assert rt.nexus.counts()["proposition"] == props


def test_KIP2_EPI_003_trusted_support_yields_accepted(log: Log) -> None:
    cap = log.publish("alice", "Support me")
    log.assess("bob", cap, "reproduced")
    rt = log.runtime(trust={log.did("bob"): "trusted"})
    b = belief_of(rt, cap)
    assert b["status"] == "accepted" and b["leading"] == "support"


def test_KIP2_EPI_004_trusted_opposition_yields_rejected(log: Log) -> None:
    cap = log.publish("alice", "Oppose me")
    log.assess("carol", cap, "not_reproduced")
    log.retract("alice", cap)  # the author's own support is withdrawn
    rt = log.runtime(trust={log.did("carol"): "trusted"})
    assert belief_of(rt, cap)["status"] == "rejected"


def test_KIP2_EPI_005_support_plus_opposition_yields_contested(log: Log, scene) -> None:
    b = belief_of(log.runtime(), scene["A"])
    assert b["status"] == "contested"
    assert b["support"]["assertion_ids"] and b["opposition"]["assertion_ids"]  # neither side discarded


def test_KIP2_EPI_006_weak_material_yields_uncertain(log: Log, scene) -> None:
    b = belief_of(log.runtime(), scene["C"])  # a hypothesis: the author's stance is uncertain
    assert b["status"] == "uncertain"


def test_KIP2_EPI_007_confidence_is_not_belief_probability(log: Log, scene) -> None:
    rt = log.runtime()
    b = belief_of(rt, scene["A"])
    assert b["support"]["score"] is None and b["opposition"]["score"] is None
    assertions = rows(rt, 'FIND(?a) WHERE { ?a ASSERTION {stance: "support"} }')
    assert all("confidence" not in row[0] for row in assertions)


def test_KIP2_EPI_008_search_score_does_not_become_confidence(log: Log, scene) -> None:
    rt = log.runtime()
    before = rows(rt, 'FIND(?a) WHERE { ?a ASSERTION {} } ORDER BY ?a.id')
    hits = rows(rt, 'FIND(?h, ?h.retrieval.score) WHERE { ?h SEARCH ASSERTION "support" LIMIT 10 }')
    assert hits and all(0 <= score <= 1 for _, score in hits)
    after = rows(rt, 'FIND(?a) WHERE { ?a ASSERTION {} } ORDER BY ?a.id')
    assert after == before
    assert all("retrieval" not in row[0] and "confidence" not in row[0] for row in after)


def test_KIP2_EPI_009_reads_do_not_reinforce(log: Log, scene) -> None:
    rt = log.runtime()
    before = rt.nexus.fingerprint()
    for _ in range(5):
        belief_of(rt, scene["A"])
        rows(rt, 'FIND(?c, ?h) WHERE { ?c {type: "KnowledgeCapsule"} OPTIONAL { ?h SEARCH CONCEPT "water" LIMIT 2 } }')
    assert rt.nexus.fingerprint() == before


def test_KIP2_EPI_010_hypothesis_not_accepted_by_default(log: Log) -> None:
    cap = log.publish("alice", "Maybe", kind="hypothesis")
    log.assess("alice", cap, "applied")
    assert belief_of(log.runtime(), cap)["status"] == "uncertain"


def test_KIP2_EPI_011_hypothetical_inclusion_is_explicit(log: Log, scene) -> None:
    # No hypothetical-mode Assertions exist in an imported nexus; asking to include them is accepted,
    # changes nothing silently, and the basis still names the policy actually used.
    rt = log.runtime()
    b = belief_of(rt, scene["C"], tail='WITH EPISTEMIC {include_hypothetical: true, policy: "kip:structural"}')
    assert b["basis"]["policy"] == {"id": "kip:structural", "version": 1}
    assert b["status"] == "uncertain"


def test_KIP2_EPI_012_no_predicted_or_observed_modes(log: Log, scene) -> None:
    rt = log.runtime()
    modes = rows(rt, 'FIND(?a.mode) WHERE { ?a ASSERTION {} }')
    assert modes and {m for (m,) in modes} == {"imported"}


def test_KIP2_EPI_013_imported_is_not_local_endorsement(log: Log) -> None:
    cap = log.publish("alice", "Self-published claim")
    rt = log.runtime()
    assert rows(rt, 'FIND(COUNT(?a)) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?p (?c, "ak_holds", true) '
                    '?a ASSERTION {proposition: ?p, mode: "imported"} }', k=cap) == [[1]]
    b = belief_of(rt, cap)
    assert b["status"] == "uncertain" and "uncorroborated" in b["uncertainty"]["reasons"]


def test_KIP2_EPI_014_provenance_roots_are_traceable(log: Log, scene) -> None:
    rt = log.runtime()
    b = belief_of(rt, scene["A"], tail='WITH EPISTEMIC {explanation: "ledger"}')
    roots = {g["root"] for g in b["support"]["root_groups"]}
    assert roots == {f"actor:{log.did('alice')}", f"actor:{log.did('bob')}"}
    cites = rows(rt, 'FIND(?a.evidence) WHERE { ?who {type: "Agent", key: :bob} ?a ASSERTION {asserted_by: ?who} }',
                 bob=log.did("bob"))
    evidence_id = cites[0][0][0]["id"]
    signed = rows(rt, 'FIND(?e.payload.inline.signature) WHERE { ?e EVIDENCE {id: :id} }', id=evidence_id)
    assert signed and signed[0][0]  # the root is the exact signed envelope


def test_KIP2_EPI_015_repeated_copies_do_not_multiply(log: Log) -> None:
    cap = log.publish("alice", "Claim")
    for _ in range(3):
        log.assess("bob", cap, "supports")
    b = belief_of(log.runtime(), cap)
    bob_groups = [g for g in b["support"]["root_groups"] if g["root"] == f"actor:{log.did('bob')}"]
    assert len(bob_groups) == 1 and len(bob_groups[0]["assertion_ids"]) == 3


def test_KIP2_EPI_016_redelivery_is_not_source_diversity(log: Log) -> None:
    cap = log.publish("alice", "Claim")
    log.assess("bob", cap, "supports")
    rt = log.runtime()
    before = belief_of(rt, cap)
    original = log.records[-1]
    duplicate = Record(seq=rt.nexus.head + 1, accepted_at=original.accepted_at + 1, envelope=original.envelope)
    assert import_record(rt.nexus, duplicate).status == "no_effect"  # the same signed event again, via a peer
    after = belief_of(rt, cap)
    assert after["support"]["assertion_ids"] == before["support"]["assertion_ids"]


def test_KIP2_EPI_017_independent_sources_remain_independent(log: Log) -> None:
    cap = log.publish("alice", "Claim")
    log.assess("bob", cap, "supports")
    log.assess("carol", cap, "reproduced")
    b = belief_of(log.runtime(), cap)
    assert len(b["support"]["root_groups"]) == 3


def test_KIP2_EPI_018_self_corroboration_does_not_amplify(log: Log) -> None:
    cap = log.publish("alice", "Claim")
    log.assess("alice", cap, "supports")
    log.assess("alice", cap, "reproduced")
    b = belief_of(log.runtime(), cap)
    assert b["status"] == "uncertain" and len(b["support"]["root_groups"]) == 1


def test_KIP2_EPI_019_functional_conflicts_not_applicable(log: Log, scene) -> None:
    # No akrelay predicate is functional, so values never conflict in a slot; the slot says so.
    rt = log.runtime()
    slot = rows(rt, 'FIND(?s.explanation.functional) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
                    '?s BELIEF SLOT (?c, "ak_holds") }', k=scene["A"])
    assert slot == [[False]]


def test_KIP2_EPI_020_valid_times_not_applicable(log: Log, scene) -> None:
    # Imported Assertions carry no valid time (issue 6, §25.2): FOR TIME cannot split candidates.
    rt = log.runtime()
    assert rows(rt, 'FIND(COUNT(?a.valid_time)) WHERE { ?a ASSERTION {} }') == [[0]]


def test_KIP2_EPI_021_as_of_and_for_time_are_independent(log: Log, scene) -> None:
    rt = log.runtime()
    query = ('FIND(?b.status, ?b.basis.snapshot_seq, ?b.basis.valid_at) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
             '?b BELIEF (?c, "ak_holds", true) } AS OF SEQ :s FOR TIME :t')
    then = kql(rt, query, k=scene["A"], s=4, t="2030-01-01T00:00:00.000Z")
    now = kql(rt, query, k=scene["A"], s=6, t="2030-01-01T00:00:00.000Z")
    assert then["result"]["rows"] == [["uncertain", 4, "2030-01-01T00:00:00.000Z"]]
    assert now["result"]["rows"] == [["contested", 6, "2030-01-01T00:00:00.000Z"]]
    assert (then["context"]["snapshot_seq"], then["context"]["valid_time"]) == (4, "2030-01-01T00:00:00.000Z")


def test_KIP2_EPI_022_projection_is_read_only(log: Log, scene) -> None:
    rt = log.runtime()
    before, head = rt.nexus.fingerprint(), rt.nexus.head
    for key in scene.values():
        belief_of(rt, key)
        rows(rt, 'FIND(?s) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?s BELIEF SLOT (?c, "ak_holds") }', k=key)
    assert rt.nexus.fingerprint() == before and rt.nexus.head == head


def test_KIP2_EPI_023_projection_policy_identity_is_observable(log: Log, scene) -> None:
    rt = log.runtime()
    default = kql(rt, 'FIND(?b.basis.policy) WHERE { ?c {type: "KnowledgeCapsule", key: :k} '
                      '?b BELIEF (?c, "ak_holds", true) }', k=scene["B"])
    assert default["result"]["rows"] == [[{"id": "akrelay:corroborated", "version": 1}]]
    assert default["context"]["projection_basis"]["policy"] == {"id": "akrelay:corroborated", "version": 1}
    structural = belief_of(rt, scene["B"], tail='WITH EPISTEMIC {policy: "kip:structural"}')
    assert structural["basis"]["policy"] == {"id": "kip:structural", "version": 1}
    assert structural["status"] == "accepted"  # baseline: author support suffices
    assert err(rt, 'FIND(?c) WHERE { ?c {} } WITH EPISTEMIC {policy: "nope"}').code == "ProjectionPolicyUnavailable"


def test_KIP2_EPI_024_no_undeclared_numeric_scores(log: Log, scene) -> None:
    rt = log.runtime()
    for key in scene.values():
        b = belief_of(rt, key)
        for side in ("support", "opposition"):
            assert b[side]["score"] is None or b[side]["score_semantics"]


def test_KIP2_EPI_025_absence_of_evidence_is_not_evidence_of_absence(log: Log, scene) -> None:
    rt = log.runtime()
    b = rows(rt, 'FIND(?b.status) WHERE { ?c {type: "KnowledgeCapsule", key: :k} ?d {type: "KnowledgeCapsule", key: :q} '
                 '?b BELIEF (?c, "ak_supports", ?d) }', k=scene["A"], q=scene["Q"])
    assert b == [["insufficient"]]


# ============================================================================ META suite


def test_KIP2_META_001_primer_exposes_coordinates(log: Log, scene) -> None:
    primer = log.runtime().meta("DESCRIBE PRIMER")
    text = json.dumps(primer)
    assert primer["protocol"]["kip"] == "2.0"
    assert primer["execution_context"]["space"]["id"].startswith("akrelay:")
    assert "kip://akrelay/agent-knowledge@1.0.0" in text
    assert "SEARCH score != confidence" in text


def test_KIP2_META_002_primer_distinguishes_principal_and_self(log: Log) -> None:
    ctx = log.runtime().meta('DESCRIBE PRIMER MODE "full"')["execution_context"]
    assert ctx["principal"] != ctx["self"]
    assert ctx["self"] is None


def test_KIP2_META_003_describe_protocol_reports_version(log: Log) -> None:
    assert log.runtime().meta("DESCRIBE PROTOCOL")["kip"] == "2.0"


def test_KIP2_META_004_resolved_space_in_primer_and_space(log: Log) -> None:
    # The seed (§63.3) folds EXECUTION CONTEXT into DESCRIBE PRIMER / DESCRIBE SPACE.
    rt = log.runtime()
    assert rt.meta("DESCRIBE SPACE")["space_id"] == rt.nexus.space_id
    response = request(rt, {"command": "DESCRIBE EXECUTION CONTEXT"})
    assert response["results"][0]["error"]["code"] == "UnsupportedCapability"


def test_KIP2_META_005_describe_type_exact_identity(log: Log) -> None:
    described = log.runtime().meta('DESCRIBE TYPE "KnowledgeCapsule"')
    assert "kip://akrelay/agent-knowledge@1.0.0/KnowledgeCapsule" in json.dumps(described)


def test_KIP2_META_006_ambiguous_symbol_fails(log: Log, tmp_path: Path) -> None:
    from akrelay.kip import KipConfig, Nexus
    from akrelay.kip.package import DEFAULT_PACKAGE_PATH
    from akrelay.kip.runtime import KipRuntime

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"ref": "kip://other/pkg@1.0.0", "description": "clash",
                                 "symbols": {"ak_holds": {"kind": "Predicate", "description": "x"}}}))
    config = KipConfig(origin="https://kql.relay.example", package_paths=(str(DEFAULT_PACKAGE_PATH), str(other)))
    rt = KipRuntime(config, Nexus(config.space_id), cursor_secret=b"k")
    response = request(rt, {"command": 'DESCRIBE PREDICATE "ak_holds"'})
    assert response["results"][0]["error"]["code"] == "SchemaSymbolAmbiguous"
    with pytest.raises(Exception) as info:
        execute_kql(rt, 'FIND(?p) WHERE { ?p (?c, "ak_holds", true) }', {}, 0, now_ms=NOW)
    assert info.value.code == "SchemaSymbolAmbiguous"


def test_KIP2_META_007_keyword_search_returns_exact_identity(log: Log, scene) -> None:
    rt = log.runtime()
    hits = rt.meta('SEARCH CONCEPT "boils" LIMIT 5')["hits"]
    assert hits[0]["kind"] == "concept" and hits[0]["id"]
    in_kql = rows(rt, 'FIND(?h.id, ?h.kind, ?h.key) WHERE { ?h SEARCH CONCEPT "boils" LIMIT 5 }')
    assert in_kql == [[hits[0]["id"], "concept", scene["A"]]]


def test_KIP2_META_008_search_score_is_transient(log: Log, scene) -> None:
    rt = log.runtime()
    before = rt.nexus.fingerprint()
    rows(rt, 'FIND(?h.retrieval.score) WHERE { ?h SEARCH CONCEPT "water" LIMIT 5 }')
    rt.meta('SEARCH CONCEPT "water" LIMIT 5')
    assert rt.nexus.fingerprint() == before
    view = rows(rt, 'FIND(?c) WHERE { ?c {type: "KnowledgeCapsule", key: :k} }', k=scene["A"])[0][0]
    assert "retrieval" not in view


def test_KIP2_META_009_search_miss_is_not_absence(log: Log, scene) -> None:
    rt = log.runtime()
    miss = kql(rt, 'FIND(?h) WHERE { ?h SEARCH CONCEPT "zyzzyva" LIMIT 5 }')
    assert miss["result"]["rows"] == [] and miss["result"]["approximate"] is True
    exact = rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", key: :k} }', k=scene["A"])
    assert exact == [["Water boils at 100 C"]]


def test_KIP2_META_010_search_freshness_disclosed(log: Log, scene) -> None:
    rt = log.runtime()
    found = kql(rt, 'FIND(?h) WHERE { ?h SEARCH CONCEPT "water" LIMIT 5 }')
    assert found["context"]["search"] == {"index_seq": rt.nexus.head, "consistency": "synchronous", "mode": "keyword"}


def test_KIP2_META_012_capabilities_do_not_leak_spaces(log: Log) -> None:
    rt = log.runtime()
    text = json.dumps(rt.meta("DESCRIBE CAPABILITIES"))
    assert rt.nexus.space_id in text or "space" not in text
    response = request(rt, {"command": "LIST SPACES"})
    assert response["results"][0]["error"]["code"] == "UnsupportedCapability"


def test_KIP2_META_024_readonly_rejects_commit_kml(log: Log) -> None:
    rt = log.runtime()
    head = rt.nexus.head
    kml = request(rt, {"command": 'UPSERT CONCEPT ?x {type: "Agent", key: "k"}'})
    assert kml["results"][0]["error"]["code"] == "ReadonlyViolation"
    preview = request(rt, {"command": "PREVIEW KML :cmd", "parameters": {"cmd": "CREATE CONCEPT ?x {}"}})
    assert preview["results"][0]["error"]["code"] == "UnsupportedCapability"  # PREVIEW is not served
    assert rt.nexus.head == head


# ========================================================================= Runtime suite


def test_KIP2_RT_001_utf8_round_trip(log: Log) -> None:
    title = "Eau bouillante à 100 °C — 水は沸騰する 🔥"
    log.publish("alice", title)
    rt = log.runtime()
    assert rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: :n} }', n=title) == [[title]]
    assert rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: "Eau bouillante \\u00e0 100 \\u00b0C '
                    '\\u2014 \\u6c34\\u306f\\u6cb8\\u9a30\\u3059\\u308b \\ud83d\\udd25"} }') == [[title]]


def test_KIP2_RT_002_invalid_utf8_rejected(log: Log) -> None:
    from litestar.testing import TestClient

    from akrelay.process.worker import create_app
    from akrelay.relay.config import RelayConfig
    from akrelay.relay.core import Relay
    from akrelay.settings import defaults
    from akrelay.store.memory import MemoryStore

    relay = Relay(MemoryStore(), RelayConfig(origin="https://localhost:8443"), cursor_secret=b"k" * 32)
    with TestClient(create_app(relay, defaults(write_rate=0.0, read_rate=0.0)),
                    raise_server_exceptions=False) as client:
        body = b'{"kip": "2.0", "operations": [{"command": "FIND(?c) WHERE { ?c {name: \\"\xff\xfe\\"} }"}]}'
        r = client.post("/v1/kip", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "InvalidRequestEnvelope"


def test_KIP2_RT_004_structural_binding_prevents_injection(log: Log, scene) -> None:
    rt = log.runtime()
    before = rt.nexus.fingerprint()
    payloads = ['x"} } UNION { ?c {type: "Agent"} } //', "FIND(?c) WHERE { ?c {} }", ':k', '?c']
    for payload in payloads:
        assert rows(rt, 'FIND(?c) WHERE { ?c {type: "KnowledgeCapsule", key: :k} }', k=payload) == []
    response = request(rt, {"command": 'FIND(?c) WHERE { ?c {type: :t} }', "parameters": {"t": 'Agent"} CREATE'}})
    assert response["results"][0]["error"]["code"] == "SchemaSymbolNotFound"
    assert rt.nexus.fingerprint() == before


def test_KIP2_RT_005_placeholder_text_is_not_code(log: Log) -> None:
    log.publish("alice", "Hello :name")
    rt = log.runtime()
    assert rows(rt, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: "Hello :name"} }',
                name="SHOULD NOT APPEAR") == [["Hello :name"]]


def test_KIP2_RT_006_non_finite_number_rejected(log: Log, scene) -> None:
    rt = log.runtime()
    for bad in (float("nan"), float("inf"), float("-inf")):
        assert err(rt, 'FIND(?c) WHERE { ?c {} } LIMIT :n', n=bad).code == "TypeMismatch"
    assert err(rt, "FIND(?c) WHERE { ?c {n: 1e400} }").code == "InvalidSyntax"
    assert err(rt, "FIND(?c) WHERE { ?c {} } LIMIT 9007199254740993").code == "InvalidSyntax"


def test_KIP2_RT_007_language_label_cannot_downgrade_write(log: Log) -> None:
    rt = log.runtime()
    head = rt.nexus.head
    for label in ("META", "KQL"):
        response = request(rt, {"language": label, "command": 'CREATE CONCEPT ?x {type: "Agent"}'})
        assert response["results"][0]["error"]["code"] in ("ReadonlyViolation", "LanguageMismatch")
    assert rt.nexus.head == head


def test_KIP2_RT_008_multi_operation_requires_execution_mode(log: Log) -> None:
    rt = log.runtime()
    response = request(rt, {"command": "DESCRIBE PROTOCOL"}, {"command": 'FIND(?c) WHERE { ?c {} }'})
    assert response["_http_status"] == 400
    assert response["error"]["code"] == "InvalidRequestEnvelope"


def test_KIP2_RT_009_independent_reads_identify_their_snapshot(log: Log, scene) -> None:
    rt = log.runtime()
    response = request(rt, {"op_id": "a", "command": 'FIND(COUNT(?c)) WHERE { ?c {type: "KnowledgeCapsule"} }'},
                       {"op_id": "b", "command": 'FIND(COUNT(?c)) WHERE { ?c {type: "KnowledgeCapsule"} } AS OF SEQ 1'},
                       execution={"mode": "independent"})
    a, b = response["results"]
    assert a["context"]["snapshot_seq"] == rt.nexus.head and a["result"]["rows"] == [[4]]
    assert b["context"]["snapshot_seq"] == 1 and b["result"]["rows"] == [[1]]


def test_KIP2_RT_013_readonly_batch_has_snapshot_but_no_receipt(log: Log, scene) -> None:
    rt = log.runtime()
    shared = request(rt, {"command": 'FIND(COUNT(?c)) WHERE { ?c {} }'}, {"command": "DESCRIBE SNAPSHOT"},
                     execution={"mode": "sequence"})
    assert shared["receipt"] is None and shared["snapshot"]["snapshot_seq"] == rt.nexus.head
    assert {r["context"]["snapshot_seq"] for r in shared["results"]} == {rt.nexus.head}
    atomic = request(rt, {"command": 'FIND(COUNT(?c)) WHERE { ?c {} }'}, {"command": "DESCRIBE SNAPSHOT"},
                     execution={"mode": "atomic"})
    assert atomic["error"]["code"] == "UnsupportedCapability"  # atomic_batch is not offered, never faked


def test_KIP2_RT_016_continuation_token_is_opaque(log: Log, scene) -> None:
    rt = log.runtime()
    command = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} } ORDER BY ?c.name LIMIT 1'
    token = kql(rt, command)["result"]["next_cursor"]
    import base64

    sealed = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    body, tag = sealed[:-16], sealed[-16:]  # the token is a JSON body and its 16-byte tag
    raw = json.loads(body)
    raw["o"] = 3  # skip ahead by editing the position
    forged = base64.urlsafe_b64encode(json.dumps(raw, separators=(",", ":")).encode() + tag).rstrip(b"=").decode()
    for bad in (forged, token[:-2] + ("AA" if token[-2:] != "AA" else "BB"), "not-a-cursor"):
        e = err(rt, command + " CURSOR :c", c=bad)
        assert e.code == "CursorInvalid" and e.details["family"] == "kql"


def test_KIP2_RT_017_snapshot_token_not_applicable(log: Log) -> None:
    # No snapshot tokens are issued (AS OF SEQ names coordinates) and the Space is public.
    rt = log.runtime()
    response = request(rt, {"command": "DESCRIBE PROTOCOL"}, read={"snapshot_token": "abc"})
    assert response["error"]["code"] in ("UnsupportedCapability", "InvalidRequestEnvelope")


def test_KIP2_RT_018_search_reports_its_real_consistency(log: Log, scene) -> None:
    rt = log.runtime()
    response = request(rt, {"command": 'FIND(?h) WHERE { ?h SEARCH CONCEPT "water" LIMIT 3 }'})
    ctx = response["results"][0]["context"]
    assert ctx["search"]["index_seq"] == ctx["snapshot_seq"] and ctx["search"]["consistency"] == "synchronous"


def test_KIP2_RT_019_no_silent_isolation_downgrade(log: Log) -> None:
    response = request(log.runtime(), {"command": "DESCRIBE PROTOCOL"}, execution={"mode": "independent",
                                                                                 "isolation": "serializable"})
    assert response["error"]["code"] == "UnsupportedIsolation"


def test_KIP2_RT_020_no_silent_capability_downgrade(log: Log, scene) -> None:
    rt = log.runtime()
    response = request(rt, {"command": 'FIND(?c) WHERE { ?c {} }'}, requires={"semantic_search": True})
    assert response["error"]["code"] == "UnsupportedCapability"
    assert err(rt, 'FIND(?h) WHERE { ?h SEARCH CONCEPT "water" MODE "semantic" LIMIT 3 }').code == "SearchModeUnsupported"


def test_KIP2_RT_030_cursor_families_are_not_interchangeable(log: Log, scene) -> None:
    rt = log.runtime()
    search_cursor = rt.meta('SEARCH CONCEPT "physics water boils ice" LIMIT 1')["next_cursor"]
    list_cursor = rt.meta("LIST PREDICATES LIMIT 1")["next_cursor"]
    for foreign in (search_cursor, list_cursor):
        e = err(rt, 'FIND(?c) WHERE { ?c {} } LIMIT 1 CURSOR :c', c=foreign)
        assert e.code == "CursorTypeMismatch"
    kql_cursor = kql(rt, 'FIND(?c) WHERE { ?c {} } LIMIT 1')["result"]["next_cursor"]
    response = request(rt, {"command": "LIST PREDICATES LIMIT 1 CURSOR :c", "parameters": {"c": kql_cursor}})
    assert response["results"][0]["error"]["code"] == "CursorTypeMismatch"
