"""object_cases: step 1, payload rules and target rules over a retained set."""

from __future__ import annotations

import pytest

from akrelay.protocol.dependencies import check_targets, dependencies
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import check_payload_rules
from knowledge_vectors import FIXTURES, cases, envelope, from_dict, hash_of, raw_envelope

CASES = cases("object_cases")


def validate(name):
    """Step 1 (``verify_envelope`` inside ``envelope``) and step 3 of §8.1."""
    item = envelope(name)
    check_payload_rules(item)
    return item


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_object_case(case):
    retained = {}
    for name in case["accepted"]:
        item = validate(name)
        check_targets(item, retained.get)
        retained[item.id] = item
    try:
        item = validate(case["fixture"])
        check_targets(item, retained.get)
        outcome = "valid"
    except ProtocolError as exc:
        outcome = exc.code
        if outcome == "missing_dependency":
            assert exc.data == {"missing": case["missing"]}
    assert outcome == case["expected"]


def test_dependencies_are_distinct_and_sorted():
    merge = envelope("merge")
    targets = [r["target"] for r in merge.payload["relations"]]
    assert dependencies(merge) == sorted(set(targets))
    assert dependencies(envelope("assessment")) == [hash_of("original")]
    assert dependencies(envelope("original")) == []


def test_every_fixture_dependency_is_ascii_sorted():
    for name in FIXTURES:
        deps = dependencies(from_dict(raw_envelope(name)))
        assert deps == sorted(deps, key=lambda s: s.encode("ascii"))


def test_invalid_target_names_the_offending_link():
    retained = {hash_of("original"): envelope("original")}
    with pytest.raises(ProtocolError) as info:
        check_targets(envelope("cross_author_supersedes"), retained.get)
    assert info.value.code == "invalid_target"
    assert info.value.data["target"] == hash_of("original")
    assert "same actor" in info.value.message


def test_missing_dependency_is_reported_before_target_rules():
    """With one target missing and another wrong, the client first needs the missing one."""
    retained = {hash_of("original"): envelope("original")}
    merge = envelope("merge")
    with pytest.raises(ProtocolError) as info:
        check_targets(merge, retained.get)
    assert info.value.code == "missing_dependency"
    assert info.value.data == {"missing": sorted(set(dependencies(merge)) - set(retained))}
