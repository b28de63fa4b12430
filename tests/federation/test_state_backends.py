"""The federation state's interface, the same on its SQLite file and in Redis (``new_state``)."""

from __future__ import annotations

from akrelay.federation.state import PeerState

A, B = "https://a.example", "https://b.example"


def test_peer_state_round_trips_and_lists_in_origin_order(new_state) -> None:
    state = new_state()
    assert state.get(A) == PeerState(A) and state.all() == []
    st = PeerState(B, checkpoint=7, peer_checkpoint=9, last_error="x")
    st.bump("accepted", 3)
    state.put(st)
    state.put(PeerState(A, checkpoint=1))
    assert state.get(B) == st and state.get(B).lag == 2
    assert [s.origin for s in state.all()] == [A, B]


def test_pending_entries_oldest_first_updated_in_place_and_removed(new_state) -> None:
    state = new_state()
    assert state.add_pending(A, "e1", b"\x00raw-1", ["d2", "d1"], now_ms=10) == 0
    assert state.add_pending(A, "e2", b"raw-2", ("d3",), now_ms=20, retry_at=99) == 0
    assert state.add_pending(B, "e9", b"raw-9", ["d9"], now_ms=30) == 0
    # A second sighting keeps the entry's place and first time; it counts an attempt.
    assert state.add_pending(A, "e1", b"ignored", ["d1"], now_ms=40, retry_at=50) == 0
    first, second = state.pending(A)
    assert (first.event_id, first.raw, first.missing, first.added_at, first.attempts, first.retry_at) == (
        "e1", b"\x00raw-1", ("d1",), 10, 2, 50)
    assert (second.event_id, second.missing, second.attempts, second.retry_at) == ("e2", ("d3",), 1, 99)
    assert [e.event_id for e in state.pending(A, limit=1)] == ["e1"] and state.pending(A, limit=0) == []
    assert state.pending_count(A) == 2 and state.pending_count() == 3
    assert state.is_pending(A, "e2") and not state.is_pending(B, "e2")
    assert list(state.iter_origins_with_pending()) == [A, B]
    assert state.remove_pending(A, "e1") and not state.remove_pending(A, "e1")
    assert state.remove_pending(A, "e2")
    assert state.pending(A) == [] and list(state.iter_origins_with_pending()) == [B]


def test_pending_set_is_bounded_by_count_and_bytes_per_peer(new_state) -> None:
    state = new_state(max_pending=3, max_pending_bytes=25)
    for i in range(3):
        assert state.add_pending(A, f"e{i}", b"x" * 8, ["d"], now_ms=i) == 0
    assert state.add_pending(A, "e3", b"x" * 8, ["d"], now_ms=3) == 1  # count: the oldest goes
    assert [e.event_id for e in state.pending(A)] == ["e1", "e2", "e3"]
    assert state.add_pending(A, "mid", b"y" * 9, ["d"], now_ms=4) == 1  # count again
    assert state.add_pending(A, "big", b"y" * 16, ["d"], now_ms=5) == 2  # bytes: as many as needed (41, 33, 25)
    assert [e.event_id for e in state.pending(A)] == ["mid", "big"]
    assert state.add_pending(A, "huge", b"z" * 100, ["d"], now_ms=6) == 2  # one entry is always kept
    assert [e.event_id for e in state.pending(A)] == ["huge"]
    assert state.add_pending(B, "other", b"x" * 8, ["d"], now_ms=6) == 0  # per peer
    assert state.pending_count() == 2
