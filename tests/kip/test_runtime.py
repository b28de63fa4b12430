"""The read-only runtime: request/response envelopes, META, KML refusal, errors."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from akrelay.kip import KipConfig
from akrelay.kip.runtime import KipRuntime

from .conftest import ORIGIN, World

SCHEMAS = Path(__file__).resolve().parent / "schemas"
REQUEST = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "kip-request.schema.json").read_text()))
RESPONSE = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "kip-response.schema.json").read_text()))


@pytest.fixture
def populated(world: World) -> tuple[World, KipRuntime]:
    cap = world.publish("alice", "observation", "Cache language in the key", tags=["caching"],
                        statement="A user-only cache key reuses the first language.")
    world.publish("bob", "hypothesis", "Caches hide language bugs", relations=[("extends", cap.id)])
    world.assess("carol", cap.id, "reproduced", "Reproduced the cache fixture")
    return world, KipRuntime(KipConfig(origin=ORIGIN), world.nexus(), cursor_secret=b"s" * 32)


def run(rt: KipRuntime, *commands: str, params: dict | None = None, **extra) -> dict:
    ops = [{"op_id": f"op-{i}", "command": c} for i, c in enumerate(commands)]
    request = {"kip": "2.0", "operations": ops, **extra}
    if params is not None:
        request["parameters"] = params
    if len(ops) > 1 and "execution" not in request:
        request["execution"] = {"mode": "independent"}
    REQUEST.validate(request)
    status, response = rt.execute(request)
    RESPONSE.validate(response)
    assert status == 200
    return response


def result_of(rt: KipRuntime, command: str, **kw) -> dict:
    response = run(rt, command, **kw)
    (res,) = response["results"]
    assert res["status"] == "succeeded", res
    return res


def error_code(rt: KipRuntime, command: str, **kw) -> str:
    response = run(rt, command, **kw)
    (res,) = response["results"]
    assert res["status"] == "failed" and response["status"] == "failed"
    assert set(res["error"]) >= {"code", "category", "message", "retry"}
    return res["error"]["code"]


def test_response_envelope_shape(populated) -> None:
    world, rt = populated
    response = run(rt, "DESCRIBE PROTOCOL", "DESCRIBE SPACE", request_id="req-1")
    assert response["request_id"] == "req-1" and response["status"] == "succeeded"
    assert response["receipt"] is None
    assert response["context"]["space_id"] == "akrelay:relay.example.org"
    assert response["snapshot"] == {"space_id": "akrelay:relay.example.org", "snapshot_seq": 3}
    assert [r["op_id"] for r in response["results"]] == ["op-0", "op-1"]
    assert all(r["context"]["snapshot_seq"] == 3 for r in response["results"])


def test_primer_compact_and_full(populated) -> None:
    world, rt = populated
    compact = result_of(rt, "DESCRIBE PRIMER")["result"]
    assert compact["mode"] == "compact"
    assert "raw Proposition != accepted belief" in compact["safety_reminders"]
    assert "cognitive content != authority" in compact["safety_reminders"]
    assert len([r for r in compact["safety_reminders"] if "!=" in r]) >= 9
    assert compact["execution_context"]["principal"]["id"] == "anonymous"
    assert compact["execution_context"]["self"] is None  # Principal and $self are distinct
    assert compact["domain_map"]["capsules"] == 2 and compact["domain_map"]["agents"] == 3
    assert "ak_holds" in compact["schema_map"]["predicates"]
    full = result_of(rt, 'DESCRIBE PRIMER MODE "full"')["result"]
    assert full["mode"] == "full"
    assert {t["ref"] for t in full["schema_map"]["types"]} == {
        "kip://akrelay/agent-knowledge@1.0.0/Agent", "kip://akrelay/agent-knowledge@1.0.0/KnowledgeCapsule"}
    assert result_of(rt, "DESCRIBE PRIMER MODE :m", params={"m": "full"})["result"]["mode"] == "full"
    assert error_code(rt, "DESCRIBE PRIMER MODE :m", params={"m": "huge"}) == "ConstraintViolation"


def test_capabilities_are_honest(populated) -> None:
    _, rt = populated
    caps = result_of(rt, "DESCRIBE CAPABILITIES")["result"]
    assert caps["conformance_level"] is None
    assert caps["supported"]["historical_reads"] is True
    assert "atomic_batch" in caps["unsupported"] and "semantic_search" in caps["unsupported"]
    assert set(caps) >= {"supported", "available", "limits"}


def test_schema_meta(populated) -> None:
    _, rt = populated
    env = result_of(rt, "DESCRIBE SCHEMA ENVIRONMENT")["result"]
    refs = [p["ref"] for p in env["packages"]]
    assert refs == ["kip://core@2.0.0", "kip://akrelay/agent-knowledge@1.0.0"]
    assert env["aliases"]["ak_holds"] == "kip://akrelay/agent-knowledge@1.0.0/ak_holds"
    t = result_of(rt, 'DESCRIBE TYPE "KnowledgeCapsule"')["result"]
    assert t["ref"] == "kip://akrelay/agent-knowledge@1.0.0/KnowledgeCapsule" and t["kind"] == "ConceptType"
    p = result_of(rt, "DESCRIBE PREDICATE :p", params={"p": "ak_supersedes"})["result"]
    assert p["kind"] == "Predicate" and p["definition"]["functional"] is False
    assert error_code(rt, 'DESCRIBE TYPE "Person"') == "SchemaSymbolNotFound"
    assert error_code(rt, 'DESCRIBE PREDICATE "KnowledgeCapsule"') == "SchemaSymbolNotFound"
    assert error_code(rt, "DESCRIBE TYPE :t") == "ReferenceError"
    types = result_of(rt, "LIST TYPES")["result"]["items"]
    assert [t["name"] for t in types] == ["Agent", "KnowledgeCapsule"]
    preds = [p["name"] for p in result_of(rt, "LIST PREDICATES")["result"]["items"]]
    assert preds == sorted(["ak_holds", "ak_derived_from", "ak_addresses", "ak_tests", "ak_extends", "ak_supports",
                            "ak_contradicts", "ak_supersedes", "ak_contains"])


def test_list_paging_with_cursor(populated) -> None:
    _, rt = populated
    first = result_of(rt, "LIST PREDICATES LIMIT 4")
    assert len(first["result"]["items"]) == 4 and "next_cursor" in first
    second = result_of(rt, "LIST PREDICATES LIMIT 4 CURSOR :c", params={"c": first["next_cursor"]})
    third = result_of(rt, "LIST PREDICATES LIMIT 4 CURSOR :c", params={"c": second["next_cursor"]})
    names = [i["name"] for r in (first, second, third) for i in r["result"]["items"]]
    assert len(names) == 9 == len(set(names)) and "next_cursor" not in third
    assert error_code(rt, "LIST TYPES LIMIT 4 CURSOR :c", params={"c": first["next_cursor"]}) == "CursorTypeMismatch"
    assert error_code(rt, "LIST PREDICATES LIMIT 3 CURSOR :c", params={"c": first["next_cursor"]}) == "CursorMismatch"
    assert error_code(rt, "LIST PREDICATES LIMIT 4 CURSOR :c", params={"c": "forged.cursor"}) == "CursorInvalid"
    assert error_code(rt, "LIST PREDICATES LIMIT 5000") == "ResultLimitExceeded"
    policies = result_of(rt, "LIST EPISTEMIC POLICIES")["result"]["items"]
    assert {(p["id"], p["version"]) for p in policies} == {("kip:structural", 1), ("kip:memory-default", 1),
                                                           ("akrelay:corroborated", 1)}
    assert [p["id"] for p in policies if p["default"]] == ["akrelay:corroborated"]


def test_epistemic_policy_and_snapshot(populated) -> None:
    world, rt = populated
    default = result_of(rt, "DESCRIBE EPISTEMIC POLICY")["result"]
    assert default["id"] == "akrelay:corroborated" and default["default"] is True
    assert result_of(rt, 'DESCRIBE EPISTEMIC POLICY "kip:structural"')["result"]["version"] == 1
    assert error_code(rt, 'DESCRIBE EPISTEMIC POLICY "nope"') == "ProjectionPolicyUnavailable"
    head = result_of(rt, "DESCRIBE SNAPSHOT")["result"]
    assert head["space_seq"] == 3 and head["tx_id"] == "tx-3"
    past = result_of(rt, "DESCRIBE SNAPSHOT AS OF SEQ 1")["result"]
    assert past["space_seq"] == 1 and past["tx_id"] == "tx-1" and past["committed_at"].endswith("Z")
    assert result_of(rt, "DESCRIBE SNAPSHOT AS OF SEQ 0")["result"]["tx_id"] is None
    assert error_code(rt, "DESCRIBE SNAPSHOT AS OF SEQ 9") == "HistoricalSnapshotUnavailable"
    at = result_of(rt, "DESCRIBE SNAPSHOT AT TIME :t", params={"t": past["committed_at"]})["result"]
    assert at["space_seq"] == 1
    assert error_code(rt, "DESCRIBE SNAPSHOT AT TIME :t", params={"t": "2026-01-01T00:00:00Z"}) == "ConstraintViolation"


def test_search_each_kind(populated) -> None:
    world, rt = populated
    res = result_of(rt, 'SEARCH CONCEPT "cache language"')
    hits = res["result"]["hits"]
    assert hits[0]["name"] == "Cache language in the key" and hits[0]["retrieval"] == {"score": 1.0, "mode": "keyword"}
    assert all(0 <= h["retrieval"]["score"] <= 1 for h in hits)
    assert [h["retrieval"]["score"] for h in hits] == sorted((h["retrieval"]["score"] for h in hits), reverse=True)
    assert res["context"]["search"] == {"index_seq": 3, "current_space_seq": 3, "consistency": "synchronous",
                                        "mode": "keyword", "score_semantics": "matched_query_term_fraction"}
    agents = result_of(rt, 'SEARCH CONCEPT :q WITH TYPE "Agent"', params={"q": world.did("bob")})["result"]["hits"]
    assert agents[0]["key"] == world.did("bob") and agents[0]["retrieval"]["score"] == 1
    assert all(h["retrieval"]["score"] < 1 for h in agents[1:]) and {h["schema_ref"][-5:] for h in agents} == {"Agent"}
    props = result_of(rt, 'SEARCH PROPOSITION "extends" WITH PREDICATE "ak_extends"')["result"]["hits"]
    assert len(props) == 1 and props[0]["predicate_ref"].endswith("/ak_extends")
    asserts = result_of(rt, 'SEARCH ASSERTION "reproduced fixture"')["result"]["hits"]
    assert asserts[0]["stance"] == "support" and asserts[0]["snippet"] == "Reproduced the cache fixture"
    ev = result_of(rt, 'SEARCH EVIDENCE "hypothesis"')["result"]["hits"]
    assert ev and ev[0]["evidence_class"] == "agent_statement"
    assert result_of(rt, 'SEARCH CONCEPT "zebra"')["result"]["hits"] == []


def test_search_threshold_limit_cursor_and_history(populated) -> None:
    world, rt = populated
    all_hits = result_of(rt, 'SEARCH CONCEPT "cache language key"')["result"]["hits"]
    assert len(all_hits) >= 2
    strict = result_of(rt, 'SEARCH CONCEPT "cache language key" THRESHOLD 1')["result"]["hits"]
    assert strict and all(h["retrieval"]["score"] == 1 for h in strict) and len(strict) < len(all_hits)
    page1 = result_of(rt, 'SEARCH CONCEPT "cache language key" LIMIT 1')
    page2 = result_of(rt, 'SEARCH CONCEPT "cache language key" LIMIT 1 CURSOR :c', params={"c": page1["next_cursor"]})
    assert [page1["result"]["hits"][0]["id"], page2["result"]["hits"][0]["id"]] == [h["id"] for h in all_hits[:2]]
    assert result_of(rt, 'SEARCH CONCEPT "hide" AS OF SEQ 1')["result"]["hits"] == []
    assert len(result_of(rt, 'SEARCH CONCEPT "hide" AS OF SEQ 2')["result"]["hits"]) == 1
    assert error_code(rt, 'SEARCH CONCEPT "x" MODE "semantic"') == "SearchModeUnsupported"
    assert error_code(rt, 'SEARCH CONCEPT "x" THRESHOLD 2') == "ConstraintViolation"
    assert error_code(rt, 'SEARCH EVIDENCE "x" WITH TYPE "Agent"') == "ConstraintViolation"
    assert error_code(rt, 'SEARCH ACTIVITY "x"') == "UnsupportedCapability"
    assert error_code(rt, 'SEARCH CONCEPT "x" WITH TYPE "Person"') == "SchemaSymbolNotFound"


@pytest.mark.parametrize("command", [
    'CREATE CONCEPT ?x {type: "Agent"}',
    'UPSERT CONCEPT ?x {type: "Agent", key: "a"}',
    'ASSERT (:a, "ak_holds", true) { by: :a, mode: "stated" }',
    'TRANSITION :a TO "retracted"',
    'MUTATE { this is not even valid',
    'DEFINE PREDICATE "p" { description: "x" }',
    'purge element :x',
])
@pytest.mark.parametrize("label", [None, "KML", "META", "KQL"])
def test_kml_is_refused_as_readonly_violation(populated, command: str, label: str | None) -> None:
    _, rt = populated
    op = {"command": command}
    if label:
        op["language"] = label
    status, response = rt.execute({"kip": "2.0", "operations": [op]})
    RESPONSE.validate(response)
    assert response["results"][0]["error"]["code"] == "ReadonlyViolation"
    assert rt.nexus.head == 3


def test_other_meta_families_are_unsupported(populated) -> None:
    _, rt = populated
    for command in ("HISTORY SPACE", "CHANGES AFTER SEQ 1", 'DESCRIBE PACKAGE "x"', "LIST SPACES",
                    'VERIFY CAPSULE :c', "DESCRIBE TRUST"):
        params = {"c": "x"} if ":c" in command else None
        assert error_code(rt, command, params=params) == "UnsupportedCapability", command


def test_syntax_and_language_errors(populated) -> None:
    _, rt = populated
    assert error_code(rt, "DESCRIBE NOTHING") == "InvalidSyntax"
    assert error_code(rt, "HELLO WORLD") == "InvalidSyntax"
    status, response = rt.execute({"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER", "language": "KML"}]})
    assert response["results"][0]["error"]["code"] == "LanguageMismatch"


def test_parameters_merge_request_and_operation(populated) -> None:
    _, rt = populated
    request = {"kip": "2.0", "parameters": {"t": "Agent", "p": "ak_holds"}, "execution": {"mode": "independent"},
               "operations": [{"command": "DESCRIBE TYPE :t"},
                              {"command": "DESCRIBE TYPE :t", "parameters": {"t": "KnowledgeCapsule"}},
                              {"command": "DESCRIBE PREDICATE :p"}]}
    status, response = rt.execute(request)
    RESPONSE.validate(response)
    assert [r["result"]["name"] for r in response["results"]] == ["Agent", "KnowledgeCapsule", "ak_holds"]
    # a parameter is a complete value: an injected clause is just an unknown symbol name
    request["operations"] = [{"command": "DESCRIBE TYPE :t", "parameters": {"t": 'Agent" LIST TYPES "'}}]
    assert rt.execute(request)[1]["results"][0]["error"]["code"] == "SchemaSymbolNotFound"


def test_sequence_stop_skips_and_partial_status(populated) -> None:
    _, rt = populated
    status, response = rt.execute({"kip": "2.0", "execution": {"mode": "sequence"},
                                   "operations": [{"command": "DESCRIBE PROTOCOL"}, {"command": "CREATE CONCEPT ?x {}"},
                                                  {"command": "DESCRIBE SPACE"}]})
    RESPONSE.validate(response)
    assert [r["status"] for r in response["results"]] == ["succeeded", "failed", "skipped"]
    assert response["status"] == "partial"
    status, response = rt.execute({"kip": "2.0", "execution": {"mode": "sequence", "on_error": "continue"},
                                   "operations": [{"command": "CREATE CONCEPT ?x {}"}, {"command": "DESCRIBE SPACE"}]})
    assert [r["status"] for r in response["results"]] == ["failed", "succeeded"]


@pytest.mark.parametrize("request_doc, code", [
    ([], "InvalidRequestEnvelope"),
    ({"operations": [{"command": "DESCRIBE PRIMER"}]}, "InvalidRequestEnvelope"),
    ({"kip": "1.0", "operations": [{"command": "DESCRIBE PRIMER"}]}, "UnsupportedProtocolVersion"),
    ({"kip": "2.0", "operations": []}, "InvalidRequestEnvelope"),
    ({"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER"}], "bogus": 1}, "InvalidRequestEnvelope"),
    ({"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER"}, {"command": "DESCRIBE SPACE"}]},
     "InvalidRequestEnvelope"),
    ({"kip": "2.0", "execution": {"mode": "atomic"}, "operations": [{"command": "DESCRIBE PRIMER"}]},
     "UnsupportedCapability"),
    ({"kip": "2.0", "requires": {"atomic_batch": True}, "operations": [{"command": "DESCRIBE PRIMER"}]},
     "UnsupportedCapability"),
    ({"kip": "2.0", "requires": {"teleportation": True}, "operations": [{"command": "DESCRIBE PRIMER"}]},
     "UnsupportedCapability"),
    ({"kip": "2.0", "space": {"id": "someone-else"}, "operations": [{"command": "DESCRIBE PRIMER"}]},
     "NotFoundOrNotVisible"),
    ({"kip": "2.0", "preconditions": {"space_seq": 1}, "operations": [{"command": "DESCRIBE PRIMER"}]},
     "PreconditionFailed"),
    ({"kip": "2.0", "ingest": {"evidence": []}, "operations": [{"command": "DESCRIBE PRIMER"}]},
     "InvalidRequestEnvelope"),
    ({"kip": "2.0", "execution": {"mode": "independent", "isolation": "serializable"},
      "operations": [{"command": "DESCRIBE PRIMER"}]}, "UnsupportedIsolation"),
    ({"kip": "2.0", "execution": {"mode": "independent"},
      "operations": [{"op_id": "a", "command": "DESCRIBE PRIMER"}, {"op_id": "a", "command": "DESCRIBE SPACE"}]},
     "InvalidRequestEnvelope"),
])
def test_envelope_errors(populated, request_doc, code: str) -> None:
    _, rt = populated
    status, response = rt.execute(request_doc)
    RESPONSE.validate(response)
    assert status == 400 and response["status"] == "failed" and response["error"]["code"] == code
    assert response["results"] == [] and response["receipt"] is None


def test_requires_supported_capability_passes(populated) -> None:
    _, rt = populated
    response = run(rt, "DESCRIBE SPACE", requires={"historical_reads": True},
                   space={"id": "akrelay:relay.example.org"}, preconditions={"space_seq": 3})
    assert response["status"] == "succeeded"


def test_python_api_meta_and_projection(populated) -> None:
    world, rt = populated
    assert rt.meta("DESCRIBE SPACE")["space_seq"] == 3
    cap_id = world.records[0].envelope.id
    out = rt.project_capsule(cap_id)
    assert out["status"] == "accepted" and out["basis"]["policy"]["id"] == "akrelay:corroborated"
    hyp_id = world.records[1].envelope.id
    assert rt.project_capsule(hyp_id)["status"] == "uncertain"
    view = rt.element(rt.nexus.capsule(cap_id).id)
    assert view["kind"] == "concept" and view["name"] == "Cache language in the key"


def test_withheld_events_are_hidden_from_reads(world: World) -> None:
    cap = world.publish("alice", "observation", "Secret cache title")
    other = world.publish("bob", "observation", "Public cache title")
    challenge = world.assess("carol", other.id, "challenges", "A withheld challenge")
    world.assess("dave", other.id, "supports")
    withheld = {cap.id, challenge.id}
    nexus = world.nexus()
    nexus.withheld = withheld.__contains__
    rt = KipRuntime(KipConfig(origin=ORIGIN), nexus)
    hits = rt.meta('SEARCH CONCEPT "cache title"')["hits"]
    assert [h["name"] for h in hits] == ["Public cache title"]
    assert rt.meta('SEARCH ASSERTION "withheld challenge"')["hits"] == []
    capsule = rt.element(nexus.capsule(cap.id).id)
    assert capsule["attributes"] == {} and capsule["name"] == cap.id
    evidence = rt.element(nexus.evidence_for_event(cap.id).id)
    assert evidence["payload"] == {"mode": "withheld", "inline": None, "content_ref": None}
    assert evidence["content_digest"] == "sha3-256:" + cap.id
    out = rt.project_capsule(other.id)
    assert out["status"] == "accepted"
    assert {"assertion_id": nexus.assertions_from_event(challenge.id)[0].id, "reason": "withheld"} in \
        out["explanation"]["ledger"]["eligibility_exclusions"]
    # the state itself is untouched: visibility is a read-time filter
    nexus.withheld = None
    assert rt.project_capsule(other.id)["status"] == "contested"
    assert rt.element(nexus.capsule(cap.id).id)["name"] == "Secret cache title"


def test_kql_results_through_the_runtime(populated) -> None:
    world, rt = populated
    request = {"kip": "2.0", "operations": [{"command": 'FIND(?c.name, ?b.status) WHERE { ?c {type: '
                                                         '"KnowledgeCapsule"} ?b BELIEF (?c, "ak_holds", true) }'}]}
    status, response = rt.execute(request)
    (res,) = response["results"]
    assert res["status"] == "succeeded" and res["context"]["snapshot_seq"] == 3
    assert sorted(res["result"]["rows"]) == [["Cache language in the key", "accepted"],
                                             ["Caches hide language bugs", "uncertain"]]
    # documented deviation (docs/kip.md): a BELIEF query's context carries projection_basis,
    # which the closed ResultContext of the copied schema does not define; all else validates
    basis = res["context"].pop("projection_basis")
    assert basis["policy"] == {"id": "akrelay:corroborated", "version": 1}
    RESPONSE.validate(response)


def test_malformed_request_id_is_not_echoed_and_space_selectors(populated) -> None:
    _, rt = populated
    status, response = rt.execute({"kip": "2.0", "request_id": "x" * 300, "operations": [{"command": "DESCRIBE SPACE"}]})
    RESPONSE.validate(response)
    assert status == 400 and "request_id" not in response
    assert error_code(rt, "DESCRIBE SPACE :s", params={"s": "akrelay:elsewhere"}) == "NotFoundOrNotVisible"
    assert result_of(rt, "DESCRIBE SPACE :s", params={"s": "akrelay:relay.example.org"})["result"]["space_seq"] == 3
    status, response = rt.execute({"kip": "2.0", "space": {"uri": "https://elsewhere.example"},
                                   "operations": [{"command": "DESCRIBE SPACE"}]})
    assert response["error"]["code"] == "NotFoundOrNotVisible"
    protocol = result_of(rt, "DESCRIBE PROTOCOL")["result"]
    assert protocol["languages"]["KML"].startswith("recognised and refused")
    assert protocol["languages"]["KQL"] == "served"
