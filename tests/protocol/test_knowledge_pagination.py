"""pagination_cases through stateless cursors and the client's page tracker.

The service side here is the test model (``knowledge_model.FixtureService``),
built from the pure core; the real stores run the same vectors in the
store-service suite. What this file proves is the core's part: cursor binding
(``CursorCodec``), ``after_seq`` rules and the client's ``PageTracker``.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akrelay.protocol.cursor import CursorCodec, CursorState
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.query import parse_query
from akrelay.protocol.records import PageTracker
from knowledge_model import FixtureService
from knowledge_vectors import SERVICE, apply_changes, cases, hash_of

CASES = cases("pagination_cases")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_pagination_case(case):
    service = FixtureService(case["accepted"], case.get("hidden") or [])
    previous = tracker = None
    for step in case["steps"]:
        for name in step.get("add", []):
            service.add(name)
        for name in step.get("hide", []):
            service.hide(name)
        service.clock += step.get("advance_ms", 0)
        try:
            request = parse_query([tuple(p) for p in step["parameters"]])
            if step.get("continue"):
                request = dataclasses.replace(request, cursor=previous["next_cursor"])
            else:
                tracker = PageTracker(SERVICE)
            response = apply_changes(service.query(request), step.get("response_changes", []))
            tracker.accept(request, response)
            outcome = "valid"
        except ProtocolError as exc:
            outcome = exc.code
        assert outcome == step["expected"]
        if outcome == "valid":
            assert [r["envelope"]["hash"] for r in response["result"]] == [hash_of(n) for n in step["matches"]]
            assert ("next_cursor" in response) is step["more"]
            previous = response


BINDING = {"q": "alpha", "limit": 1, "after_seq": 0}
STATE = CursorState(checkpoint=4, as_of=1790553600000, last_seq=1)


def test_cursor_round_trip_and_order_independence():
    codec = CursorCodec(b"s" * 32)
    token = codec.encode(BINDING, STATE)
    assert codec.decode(token, {"after_seq": 0, "limit": 1, "q": "alpha"}) == STATE


@pytest.mark.parametrize("mutate", [
    lambda t: t[:-1],                                   # truncated
    lambda t: t + "A",                                  # extended
    lambda t: t[:10] + ("B" if t[10] != "B" else "C") + t[11:],  # one byte edited
    lambda t: "",                                       # empty
    lambda t: "not-a-cursor",                           # made up
    lambda t: t.replace(t[-1], "!"),                    # not base64url
])
def test_cursor_rejects_malformed_and_forged(mutate):
    codec = CursorCodec(b"s" * 32)
    with pytest.raises(ProtocolError) as info:
        codec.decode(mutate(codec.encode(BINDING, STATE)), BINDING)
    assert info.value.code == "invalid_cursor"


def test_cursor_from_another_secret_or_binding_is_rejected():
    token = CursorCodec(b"s" * 32).encode(BINDING, STATE)
    for codec, binding in ((CursorCodec(b"t" * 32), BINDING), (CursorCodec(b"s" * 32), {**BINDING, "limit": 2})):
        with pytest.raises(ProtocolError) as info:
            codec.decode(token, binding)
        assert info.value.code == "invalid_cursor"


def test_cursor_state_checks():
    codec = CursorCodec(b"s" * 32)
    token = codec.encode(BINDING, STATE)
    for kwargs in ({"current_checkpoint": 3}, {"now_ms": STATE.as_of + 10, "max_age_ms": 5}):
        with pytest.raises(ProtocolError) as info:
            codec.decode(token, BINDING, **kwargs)
        assert info.value.code == "invalid_cursor"
    assert codec.decode(token, BINDING, current_checkpoint=4, now_ms=STATE.as_of + 5, max_age_ms=5) == STATE
    backwards = codec.encode({**BINDING, "after_seq": 2}, STATE)  # last_seq 1 < after_seq 2
    with pytest.raises(ProtocolError):
        codec.decode(backwards, {**BINDING, "after_seq": 2})


def test_weak_secret_refused():
    with pytest.raises(ValueError):
        CursorCodec(b"short")


def test_tracker_persists_checkpoint_only_when_complete():
    service = FixtureService(["text_publication", "text_regional"])
    tracker = PageTracker(SERVICE)
    first = parse_query([("limit", "1")])
    page = service.query(first)
    tracker.accept(first, page)
    assert not tracker.complete and tracker.checkpoint is None
    second = dataclasses.replace(first, cursor=page["next_cursor"])
    tracker.accept(second, service.query(second))
    assert tracker.complete and tracker.checkpoint == 2


def test_tracker_rejects_a_start_with_cursor_and_a_skipped_cursor():
    service = FixtureService(["text_publication", "text_regional", "text_assessment"])
    first = parse_query([("limit", "1")])
    page = service.query(first)
    with pytest.raises(ProtocolError):
        PageTracker(SERVICE).accept(dataclasses.replace(first, cursor=page["next_cursor"]), page)
    tracker = PageTracker(SERVICE)
    tracker.accept(first, page)
    with pytest.raises(ProtocolError) as info:
        tracker.accept(first, service.query(first))  # restarted instead of following next_cursor
    assert info.value.code == "invalid_response"


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@settings(max_examples=300, deadline=None)
@given(
    checkpoint=st.integers(0, 2**53 - 1), as_of=st.integers(0, 2**53 - 1), data=st.data(),
    limit=st.integers(1, 1000), q=st.one_of(st.none(), st.text(min_size=1, max_size=8)),
)
def test_any_single_character_edit_is_rejected(checkpoint, as_of, data, limit, q):
    last = data.draw(st.integers(0, checkpoint))
    binding = {"limit": limit, "after_seq": 0, **({"q": q} if q is not None else {})}
    codec = CursorCodec(b"s" * 32)
    token = codec.encode(binding, CursorState(checkpoint, as_of, last))
    assert codec.decode(token, binding) == CursorState(checkpoint, as_of, last)
    i = data.draw(st.integers(0, len(token) - 1))
    replacement = data.draw(st.sampled_from([c for c in _B64 if c != token[i]]))
    with pytest.raises(ProtocolError) as info:
        codec.decode(token[:i] + replacement + token[i + 1:], binding)
    assert info.value.code == "invalid_cursor"
