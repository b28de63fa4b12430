"""Service limits (§9.7) are admission policy, and the future-skew rule (§8.1 step 4)."""

from __future__ import annotations

import pytest

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.limits import DEFAULT_LIMITS, Limits, check_limits
from akrelay.protocol.timestamps import check_created_at
from knowledge_vectors import FIXTURES, NOW, envelope, from_dict, raw_envelope


def test_every_fixture_fits_the_recommended_limits():
    for name in FIXTURES:
        check_limits(from_dict(raw_envelope(name)), DEFAULT_LIMITS)


def _grown(field, value, name="original"):
    item = raw_envelope(name)
    payload = item["event"]["payload"]
    if field == "steps":
        payload["reproduction"]["steps"] = value
    else:
        payload[field] = value
    return from_dict(item)


CASES = [
    ("max_title_chars", _grown("title", "é" * 257)),
    ("max_statement_chars", _grown("statement", "x" * 16385)),
    ("max_basis_chars", _grown("basis", "😀" * 16385)),
    ("max_evidence", _grown("evidence", [{"url": f"https://e.com/{i}", "description": "d"} for i in range(65)])),
    ("max_relations", _grown("relations", [{"relation": "supports", "target": "A" * 43}] * 65)),
    ("max_tags", _grown("tags", [f"t{i}" for i in range(33)])),
    ("max_steps", _grown("steps", ["s"] * 65)),
    ("max_profiles", _grown("profiles", [{"profile": {"url": "https://e.com/", "digest": "A" * 43}, "data": {}}] * 17)),
    ("max_extra_bytes", _grown("extra", {"note": "x" * 16384})),
]


@pytest.mark.parametrize("limit,item", CASES, ids=[c[0] for c in CASES])
def test_each_limit_is_enforced_and_named(limit, item):
    with pytest.raises(ProtocolError) as info:
        check_limits(item, DEFAULT_LIMITS, envelope_bytes=1000)
    assert info.value.code == "payload_too_large"
    assert info.value.data["limit"] == limit
    assert info.value.data["actual"] > info.value.data["max"] == getattr(DEFAULT_LIMITS, limit)


def test_limits_at_the_boundary_pass():
    check_limits(_grown("title", "é" * 256), DEFAULT_LIMITS, envelope_bytes=1000)
    check_limits(_grown("tags", [f"t{i}" for i in range(32)]), DEFAULT_LIMITS, envelope_bytes=1000)


def test_envelope_bytes_limit_uses_submitted_size_or_canonical_bytes():
    item = envelope("original")
    size = len(item.canonical_bytes())
    check_limits(item, Limits(max_envelope_bytes=size))
    with pytest.raises(ProtocolError) as info:
        check_limits(item, Limits(max_envelope_bytes=size - 1))
    assert info.value.data["limit"] == "max_envelope_bytes"
    with pytest.raises(ProtocolError):
        check_limits(item, Limits(max_envelope_bytes=size), envelope_bytes=size + 1)


def test_limits_are_configurable_and_validated():
    with pytest.raises(ProtocolError):
        check_limits(_grown("tags", ["a", "b"]), Limits(max_tags=1), envelope_bytes=10)
    with pytest.raises(ValueError):
        Limits(max_tags=0)
    assert Limits().to_discovery()["max_envelope_bytes"] == 262144


def test_future_event_waits_for_the_clock():
    future = envelope("future")
    with pytest.raises(ProtocolError) as info:
        check_created_at(future, NOW)
    assert info.value.code == "timestamp_out_of_window"
    check_created_at(future, NOW + 1)
    check_created_at(future, NOW, skew_ms=300_001)


def test_old_events_have_no_lower_bound():
    check_created_at(envelope("old_event"), NOW)
    check_created_at(envelope("old_event"), 2**53 - 1)


def test_defaults_are_the_recommended_values_of_section_9_7():
    assert Limits().to_discovery() == {
        "max_envelope_bytes": 256 * 1024, "max_title_chars": 256, "max_statement_chars": 16384,
        "max_basis_chars": 16384, "max_evidence": 64, "max_relations": 64, "max_tags": 32, "max_steps": 64,
        "max_profiles": 16, "max_extra_bytes": 16 * 1024,
    }


def _deep(levels):
    root = cur = {}
    for _ in range(levels):
        cur["a"] = {}
        cur = cur["a"]
    return root


def test_pathologically_nested_extra_is_refused_with_a_code():
    item = _grown("extra", _deep(5000))
    with pytest.raises(ProtocolError) as info:
        check_limits(item, DEFAULT_LIMITS, envelope_bytes=10)
    assert info.value.code == "payload_too_large" and info.value.data["limit"] == "max_extra_bytes"
