"""view_cases: every arrival order converges on the same §7.2 view."""

from __future__ import annotations

import random

import pytest

from akrelay.protocol.dependencies import check_targets
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import check_payload_rules
from akrelay.protocol.view import materialize
from knowledge_vectors import cases, envelope, hash_of

CASES = cases("view_cases")


def converge(order):
    """Feed events one by one; a ``missing_dependency`` stays pending and is retried."""
    known, pending = {}, []
    for name in order:
        pending.append(name)
        progress = True
        while progress:
            progress = False
            for candidate in list(pending):
                item = envelope(candidate)
                before = dict(known)
                try:
                    check_payload_rules(item)
                    check_targets(item, known.get)
                except ProtocolError as exc:
                    assert exc.code == "missing_dependency", (candidate, exc.code)
                    assert known == before, "an unresolved event changed state"
                    continue
                known[item.id] = item
                pending.remove(candidate)
                progress = True
    assert not pending, pending
    return known


def _orders(case):
    orders = [list(o) for o in case["arrival_orders"]]
    rng = random.Random(case["name"])
    for _ in range(8):  # beyond the listed orders: seeded random shuffles
        extra = list(case["known"])
        rng.shuffle(extra)
        orders.append(extra)
    return orders


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_view_case(case):
    for order in _orders(case):
        assert sorted(order) == sorted(case["known"])
        known = converge(order)
        assert materialize(known.values()) == case["expected"], order
        for name, links in case.get("expected_relations", {}).items():
            assert known[hash_of(name)].payload["relations"] == links


def test_view_sets_are_sorted_and_retractions_have_no_entry():
    case = CASES[0]
    view = materialize(converge(case["known"]).values())
    for event_id, entry in view.items():
        assert envelope_type(case, event_id) != "knowledge.retract"
        for key in ("successors", "assessments", "active_assessments"):
            if key in entry:
                assert entry[key] == sorted(entry[key])


def envelope_type(case, event_id):
    for name in case["known"]:
        if hash_of(name) == event_id:
            return envelope(name).type
    raise AssertionError(event_id)


def test_withdrawal_does_not_propagate():
    items = [envelope(n) for n in ("original", "assessment", "branch_left", "retract_original")]
    view = materialize(items)
    assert view[hash_of("original")]["status"] == "retracted"
    assert view[hash_of("assessment")]["status"] == "active"
    assert view[hash_of("branch_left")]["status"] == "active"
    assert view[hash_of("original")]["active_assessments"] == [hash_of("assessment")]
    assert view[hash_of("original")]["successors"] == [hash_of("branch_left")]


def test_retracted_assessment_is_not_active():
    items = [envelope(n) for n in ("original", "assessment", "retract_assessment")]
    view = materialize(items)
    assert view[hash_of("original")]["assessments"] == [hash_of("assessment")]
    assert view[hash_of("original")]["active_assessments"] == []
    assert view[hash_of("assessment")] == {"status": "retracted"}
