"""batch_cases: request parsing (§9.4) and the client's partition checks."""

from __future__ import annotations

import pytest

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.evidence import digest_of
from akrelay.protocol.reads import parse_batch_request, parse_read_json
from akrelay.protocol.records import validate_batch_response
from knowledge_model import FixtureService
from knowledge_vectors import NOW, SERVICE, apply_changes, cases

CASES = cases("batch_cases")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_batch_case(case):
    service = FixtureService(case.get("accepted", []), case.get("hidden", []))
    before = service.state()
    try:
        value = parse_read_json(case["raw_json"]) if "raw_json" in case else case["request"]
        hashes = parse_batch_request(value)
        response = apply_changes(service.batch(hashes), case.get("response_changes", []))
        validate_batch_response(response, hashes, SERVICE)
        outcome = "valid"
    except ProtocolError as exc:
        outcome = exc.code
    assert outcome == case["expected"]
    if outcome == "valid":
        assert [r["envelope"]["hash"] for r in response["result"]] == case["result"]
        assert response["missing"] == case["missing"]
        assert response["checkpoint"] == service.seq and response["as_of"] == NOW
    assert service.state() == before, "a batch read changed state"


@pytest.mark.parametrize("value", [
    [], {"hashes": "x"}, {"hashes": [1]}, {"hashes": None}, {}, {"hashes": ["A" * 43], "hashes2": []},
    {"hashes": ["A" * 43] * 101},
])
def test_more_malformed_batch_requests(value):
    with pytest.raises(ProtocolError) as info:
        parse_batch_request(value)
    assert info.value.code == "invalid_request"


def test_batch_limit_boundary():
    ids = [digest_of(str(i).encode()) for i in range(101)]
    assert parse_batch_request({"hashes": ids[:100]}) == ids[:100]
    with pytest.raises(ProtocolError) as info:
        parse_batch_request({"hashes": ids})
    assert info.value.code == "invalid_request"


def test_strict_read_json_errors_are_invalid_request():
    for raw in (b'{"hashes":["a"],"hashes":["b"]}', b"\xff", b'{"limit": NaN}', b'{"a":"\\ud800"}'):
        with pytest.raises(ProtocolError) as info:
            parse_read_json(raw)
        assert info.value.code == "invalid_request"
