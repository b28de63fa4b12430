"""query_cases: strict parameter parsing and the §9.3 predicate, plus the index-term equivalence.

``query_matches(e, r)`` ⇔ ``request_terms(r) ⊆ index_terms(e)`` and the time range and
text match: proven on the vectors and on hypothesis-generated requests.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.query import (
    QueryRequest, in_time_range, index_terms, parse_query, query_matches, request_terms,
)
from akrelay.protocol.text import text_matches
from knowledge_vectors import FIXTURES, cases, envelope

CASES = cases("query_cases")
VALID_NAMES = sorted(
    n for n in FIXTURES
    if n not in {"userinfo_url", "research_bad_contains", "research_empty_collection", "research_resource_no_output",
                 "research_output_no_digest", "research_applied_no_observed", "research_applied_no_reproduction",
                 "research_identical_profile", "research_profile_userinfo"}
)


def _envelopes():
    return [envelope(n) for n in VALID_NAMES]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_query_case(case):
    try:
        request = parse_query([tuple(p) for p in case["parameters"]])
        matches = [name for name in case["accepted"] if query_matches(envelope(name), request)]
        outcome = "valid"
    except ProtocolError as exc:
        outcome = exc.code
    assert outcome == case["expected"]
    if outcome == "valid":
        assert matches == case["matches"]


def equivalent(item, request):
    return (set(request_terms(request)) <= set(index_terms(item)) and in_time_range(item, request)
            and (request.q is None or text_matches(item, request.q)))


@pytest.mark.parametrize("case", [c for c in CASES if c["expected"] == "valid"],
                         ids=[c["name"] for c in CASES if c["expected"] == "valid"])
def test_index_terms_agree_on_query_vectors(case):
    request = parse_query([tuple(p) for p in case["parameters"]])
    for item in _envelopes():
        assert query_matches(item, request) == equivalent(item, request), item.id


def _values(field):
    """Filter values seen in the fixtures, plus decoys, so generated requests often match."""
    seen = set()
    for item in _envelopes():
        for name, value in index_terms(item):
            if name == field:
                seen.add(value)
    return sorted(seen)


ALL_TERMS = {}
for _item in [envelope(n) for n in VALID_NAMES]:
    for _name, _value in index_terms(_item):
        if _name != "relation_target":
            ALL_TERMS.setdefault(_name, set()).add(_value)
LANGUAGES = sorted(ALL_TERMS["language"]) + ["EN", "En-Us", "zz"]
DECOY_ID = "A" * 43


def _maybe(values):
    return st.one_of(st.none(), st.sampled_from(sorted(values)))


requests = st.builds(
    QueryRequest,
    actor=_maybe(ALL_TERMS["actor"]),
    type=_maybe(ALL_TERMS["type"] | {"knowledge.retract"}),
    kind=_maybe(ALL_TERMS["kind"] | {"definition"}),
    target=_maybe(ALL_TERMS["target"] | {DECOY_ID}),
    relation=_maybe(ALL_TERMS["relation"] | {"supersedes"}),
    tag=_maybe(ALL_TERMS["tag"] | {"unseen"}),
    profile=_maybe(ALL_TERMS["profile"] | {DECOY_ID}),
    language=_maybe(LANGUAGES),
    verdict=_maybe(ALL_TERMS.get("verdict", set()) | {"challenges"}),
    created_from=st.one_of(st.none(), st.integers(0, 1790553600010)),
    created_before=st.one_of(st.none(), st.integers(1, 1790553600010)),
    q=st.one_of(st.none(), st.lists(st.sampled_from(["alpha", "cache", "withdrawn", "zzz", "key", "语言"]),
                                     min_size=1, max_size=3, unique=True).map(tuple)),
)


@settings(max_examples=400, deadline=None)
@given(request=requests, index=st.integers(0, len(VALID_NAMES) - 1))
def test_index_terms_equivalence_on_generated_requests(request, index):
    item = envelope(VALID_NAMES[index])
    assert query_matches(item, request) == equivalent(item, request)


def test_parse_defaults_and_binding_is_order_independent():
    a = parse_query([("kind", "question"), ("limit", "7"), ("q", "Alpha beta alpha")])
    b = parse_query([("q", "Alpha beta alpha"), ("limit", "007"), ("kind", "question")])
    assert a == b and a.binding() == b.binding()
    assert a.q == ("alpha", "beta") and a.after_seq == 0 and a.limit == 7
    assert parse_query([]).limit == 100 and parse_query([]).binding() == {"limit": 100, "after_seq": 0}
    assert parse_query([("after_seq", "0")]).binding() == parse_query([]).binding()


@pytest.mark.parametrize("pairs", [
    [("limit", "")], [("limit", " 1")], [("after_seq", "1 ")], [("created_from", "0x10")],
    [("actor", "did:agent:" + "A" * 42 + "B")], [("target", "A" * 43 + "\n")], [("cursor", "")],
])
def test_more_malformed_parameters(pairs):
    with pytest.raises(ProtocolError) as info:
        parse_query(pairs)
    assert info.value.code == "invalid_request"
