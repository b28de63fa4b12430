"""The agent-knowledge vector groups that need a service, run through ``Relay``.

Each test is named after its vector group and parametrized by the case name;
every case runs on the memory, the SQLite and the Redis backend.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.query import parse_query
from akrelay.protocol.records import PageTracker, validate_batch_response
from akrelay.protocol.view import materialize
from relay.support import NOW, SERVICE, VECTORS, Clock, apply_changes, envelope, hash_of, raw, state


def _cases(group: str) -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in VECTORS[group]]


# -- acceptance_cases ------------------------------------------------------------
@pytest.mark.parametrize("case", _cases("acceptance_cases"))
def test_acceptance_cases(case: dict[str, Any], make_relay: Any) -> None:
    clock = Clock()
    relay = make_relay(clock)
    originals: dict[str, bytes] = {}
    for step in case["steps"]:
        if "withhold" in step:
            before = relay.store.get(hash_of(step["withhold"]))
            relay.withhold(hash_of(step["withhold"]))
            after = relay.store.get(hash_of(step["withhold"]))
            assert after.withheld and after.seq == before.seq and after.accepted_at == before.accepted_at
            continue
        clock.now = step["now"]
        name, expected = step["fixture"], step["expected"]
        snapshot = state(relay)
        if expected in ("accepted", "resubmission"):
            record, created = relay.submit(raw(name))
            assert created is (expected == "accepted")
            assert record.envelope.id == hash_of(name)
            if expected == "accepted":
                assert record.seq == step["seq"]  # a step's seq is the checkpoint after it
                assert record.accepted_at == step["now"]
                originals[name] = record.to_json()
            else:
                # the original record, byte for byte, and no state change
                assert record.to_json() == originals[name]
                assert state(relay) == snapshot
        else:
            with pytest.raises(ProtocolError) as info:
                relay.submit(raw(name))
            assert info.value.code == expected
            if expected == "missing_dependency":
                missing = info.value.data["missing"]
                assert missing == sorted(set(missing)) and missing
                assert all(relay.store.get(m) is None for m in missing)
            assert state(relay) == snapshot
        assert relay.checkpoint() == step["seq"]


# -- pagination_cases -------------------------------------------------------------
@pytest.mark.parametrize("case", _cases("pagination_cases"))
def test_pagination_cases(case: dict[str, Any], make_relay: Any) -> None:
    clock = Clock()
    relay = make_relay(clock)
    for name in case["accepted"]:
        relay.submit(raw(name))
    for name in case.get("hidden", []):
        relay.withhold(hash_of(name))
    tracker: PageTracker | None = None
    previous: dict[str, Any] | None = None
    for step in case["steps"]:
        for name in step.get("add", []):
            relay.submit(raw(name))
        for name in step.get("hide", []):
            relay.withhold(hash_of(name))
        clock.now += step.get("advance_ms", 0)
        params = [tuple(p) for p in step["parameters"]]
        if step.get("continue"):
            assert previous is not None and "next_cursor" in previous
            params.append(("cursor", previous["next_cursor"]))
        else:
            tracker = PageTracker(SERVICE)
        expected = step["expected"]
        if expected in ("invalid_cursor", "invalid_request"):
            with pytest.raises(ProtocolError) as info:
                relay.query(params)
            assert info.value.code == expected
            continue
        page = relay.query(params)
        response = json.loads(page.to_json())
        assert response == page.to_dict()
        request = parse_query(params)
        if "matches" in step:
            assert [r["envelope"]["hash"] for r in response["result"]] == [hash_of(n) for n in step["matches"]]
            assert ("next_cursor" in response) == step["more"]
        if expected == "invalid_response":
            changed = apply_changes(response, step.get("response_changes", []))
            with pytest.raises(ProtocolError):
                tracker.accept(request, changed)
        else:
            assert expected == "valid"
            tracker.accept(request, response)
        previous = response
        # checkpoint and as_of are frozen by the first page of a traversal
        assert response["service"] == SERVICE


# -- batch_cases -----------------------------------------------------------------
@pytest.mark.parametrize("case", _cases("batch_cases"))
def test_batch_cases(case: dict[str, Any], make_relay: Any) -> None:
    relay = make_relay(Clock())
    for name in case["accepted"]:
        relay.submit(raw(name))
    for name in case.get("hidden", []):
        relay.withhold(hash_of(name))
    body = case["raw_json"].encode() if "raw_json" in case else json.dumps(case["request"]).encode()
    snapshot = state(relay)
    if case["expected"] == "invalid_request":
        with pytest.raises(ProtocolError) as info:
            relay.batch(body)
        assert info.value.code == "invalid_request"
        assert state(relay) == snapshot
        return
    page = relay.batch(body)
    response = json.loads(page.to_json())
    assert response == page.to_dict()
    assert state(relay) == snapshot
    hashes = case["request"]["hashes"]
    assert response["checkpoint"] == len(case["accepted"]) and response["as_of"] == NOW
    if case["expected"] == "valid":
        assert [r["envelope"]["hash"] for r in response["result"]] == case["result"]
        assert response["missing"] == case["missing"]
        validate_batch_response(response, hashes, SERVICE)
    else:
        assert case["expected"] == "invalid_response"
        validate_batch_response(response, hashes, SERVICE)  # ours is valid ...
        with pytest.raises(ProtocolError):  # ... the vector's mutation is not
            validate_batch_response(apply_changes(response, case["response_changes"]), hashes, SERVICE)


# -- query_cases through the store ------------------------------------------------
@pytest.mark.parametrize("case", _cases("query_cases"))
def test_query_cases(case: dict[str, Any], make_relay: Any) -> None:
    relay = make_relay(Clock())
    for name in case["accepted"]:
        relay.store.commit(envelope(name), NOW)
    params = [tuple(p) for p in case["parameters"]]
    if case["expected"] == "invalid_request":
        with pytest.raises(ProtocolError) as info:
            relay.query(params)
        assert info.value.code == "invalid_request"
        return
    # follow every page with a small limit unless the case sets its own
    if not any(k == "limit" for k, _ in params):
        params.append(("limit", "2"))
    seen: list[str] = []
    page = relay.query(params)
    tracker = PageTracker(SERVICE)
    while True:
        tracker.accept(parse_query(params), page.to_dict())
        seen.extend(r.envelope.id for r in page.records)
        if page.next_cursor is None:
            break
        follow = [p for p in params if p[0] != "cursor"] + [("cursor", page.next_cursor)]
        params_next = follow
        page = relay.query(params_next)
        params = params_next
    assert seen == [hash_of(n) for n in case["matches"]]


# -- view_cases through submit -----------------------------------------------------
@pytest.mark.parametrize("case", _cases("view_cases"))
def test_view_cases(case: dict[str, Any], make_relay: Any) -> None:
    for order in case["arrival_orders"]:
        relay = make_relay(Clock())
        pending = list(order)
        while pending:
            progressed = []
            for name in pending:
                snapshot = state(relay)
                try:
                    relay.submit(raw(name))
                except ProtocolError as exc:
                    assert exc.code == "missing_dependency"
                    assert state(relay) == snapshot
                else:
                    progressed.append(name)
            assert progressed, f"no progress with {pending}"
            pending = [n for n in pending if n not in progressed]
        records = relay.store.iter_records(0, 10**6)
        assert sorted(r.envelope.id for r in records) == sorted(hash_of(n) for n in case["known"])
        assert materialize(r.envelope for r in records) == case["expected"]
        if "expected_relations" in case:
            for name, relations in case["expected_relations"].items():
                assert relay.get(hash_of(name)).envelope.payload.get("relations", []) == relations
