"""search_cases: request parsing (§9.5), candidate guard and the client's contract checks."""

from __future__ import annotations

import pytest

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.reads import SEARCH_MODES, parse_read_json, parse_search_request
from akrelay.protocol.records import validate_search_response
from knowledge_model import FixtureService
from knowledge_vectors import SERVICE, apply_changes, cases, hash_of

CASES = cases("search_cases")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_search_case(case):
    service = FixtureService(case.get("accepted", []), case.get("hidden", []))
    before = service.state()
    try:
        value = parse_read_json(case["raw_json"]) if "raw_json" in case else case["request"]
        request = parse_search_request(value, case.get("modes", SEARCH_MODES))
        response = service.search(
            request, [hash_of(n) for n in case.get("candidates", [])],
            case.get("ranking", {"mode": request.mode, "id": "fixture-v1"}),
            case.get("coverage", {"exhaustive": True, "reasons": []}),
        )
        response = apply_changes(response, case.get("response_changes", []))
        validate_search_response(response, request, SERVICE)
        outcome = "valid"
    except ProtocolError as exc:
        outcome = exc.code
    assert outcome == case["expected"]
    if outcome == "valid":
        assert [h["record"]["envelope"]["hash"] for h in response["result"]] == case.get("result", [])
    assert service.state() == before, "a search changed state"


def test_search_defaults_and_filters():
    request = parse_search_request({"text": "Alpha  beta ALPHA", "mode": "lexical", "filters": {"kind": "question"}})
    assert request.limit == 20 and request.terms == ("alpha", "beta")
    assert request.filters.kind == "question" and request.filters.q is None


def test_mode_is_checked_before_the_rest():
    with pytest.raises(ProtocolError) as info:
        parse_search_request({"mode": "hybrid", "bogus": 1}, ("lexical",))
    assert info.value.code == "unsupported_search_mode"


@pytest.mark.parametrize("value", [
    "text", {"text": 1, "mode": "lexical"}, {"text": "a", "mode": 1}, {"text": "a", "mode": "lexical", "limit": True},
    {"text": "a", "mode": "lexical", "limit": 1.5}, {"text": "a", "mode": "lexical", "filters": []},
    {"text": "a", "mode": "lexical", "filters": {"created_from": True}},
    {"text": "a", "mode": "lexical", "filters": {"after_seq": 1}},
    {"text": "a", "mode": "lexical", "filters": {"target": "A" * 42 + "B"}},
])
def test_more_malformed_search_requests(value):
    with pytest.raises(ProtocolError) as info:
        parse_search_request(value)
    assert info.value.code == "invalid_request"


def test_integral_json_numbers_are_integers():
    request = parse_search_request({"text": "a", "mode": "lexical", "limit": 5.0, "filters": {"created_from": 1.0}})
    assert request.limit == 5 and request.filters.created_from == 1
