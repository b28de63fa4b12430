"""Hostile peers against reconciliation (issue 26): malformed answers, endless splitting, forged
fingerprints and ids, slow rounds, a flood of "need". Each costs at most the bounded rounds, bytes
and time, never makes us accept anything unverified, and the after_seq pull goes on.
"""

from __future__ import annotations

import os
import tracemalloc

import httpx
import pytest

import akrelay.federation.reconcile as reconcile
from akrelay.federation.reconcile import MEDIA_TYPE
from akrelay.federation.runner import reconcile_now
from akrelay.protocol.reconcile import (FINGERPRINT, IDLIST, MAX_MESSAGE, MAX_ROUNDS, PROTOCOL_VERSION,
                                        encode_varint)

from .conftest import Author, make_engine, make_relay, raw
from .test_reconcile_sync import ReconcilingPeer, events, peer_of


def answer(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"content-type": MEDIA_TYPE})


def infinity_range(mode: int, payload: bytes) -> bytes:
    return bytes([PROTOCOL_VERSION]) + encode_varint(0) + encode_varint(0) + encode_varint(mode) + payload


@pytest.fixture
def setup(router):
    """A hostile peer holding 40 events of which we hold 35; the engine that syncs from it."""
    peer = ReconcilingPeer(router)
    author = Author("mallory-victim")
    evs = events(author, 40)
    peer.add(*evs)
    local = make_relay()
    for env in evs[5:]:
        local.submit(raw(env))
    engine = make_engine(local, [peer_of(peer)])
    return peer, local, engine, evs


def held(local) -> set[str]:
    return {r.id for r in local.store.iter_records(0, 10_000)}


@pytest.mark.parametrize("body", [
    b"", b"\x00garbage", bytes([0x62]), bytes([PROTOCOL_VERSION, 0xFF]),
    infinity_range(7, b""), infinity_range(IDLIST, encode_varint(10**6)),
    bytes([PROTOCOL_VERSION]) + b"\0" * (MAX_MESSAGE + 10),
], ids=["empty", "not-a-version", "other-version", "truncated", "unknown-mode", "long-idlist", "oversized"])
def test_a_malformed_answer_fails_the_reconciliation_not_the_pass(setup, body: bytes) -> None:
    peer, local, engine, evs = setup
    peer.reconcile_hook = lambda request: answer(body)
    result = engine.sync_peer(engine.peers[0])
    assert result.ok, result.error  # the after_seq pull still ran (from seq 0: no bootstrap)
    st = engine.state.get(peer.origin)
    assert st.reconcile_note.startswith("reconcile failed"), st.reconcile_note
    assert st.checkpoint == peer.relay.store.checkpoint()
    assert held(local) == {e["hash"] for e in evs}


def test_an_error_status_fails_the_reconciliation_not_the_pass(setup) -> None:
    peer, local, engine, _ = setup
    peer.reconcile_hook = lambda request: httpx.Response(500, json={"error": {"code": "x", "message": "y"}})
    assert engine.sync_peer(engine.peers[0]).ok
    assert "reconcile failed" in engine.state.get(peer.origin).reconcile_note


def test_endless_splitting_stops_at_the_round_bound(setup) -> None:
    """A peer whose every answer is a new fingerprint for everything that can never match."""
    peer, local, engine, _ = setup
    counter = iter(range(10**9))
    peer.reconcile_hook = lambda request: answer(infinity_range(FINGERPRINT, next(counter).to_bytes(16, "little")))
    tracemalloc.start()
    try:
        result = reconcile_now(engine, engine.peers[0])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not result.complete
    assert peer.reconcile_calls <= MAX_ROUNDS + 1
    assert f"{MAX_ROUNDS} rounds" in (result.error or "")
    assert peer.batch_calls == []
    assert peak < 32 * 1024 * 1024, peak  # nothing accumulates across the rounds


def test_forged_ids_cost_a_batch_read_and_nothing_is_accepted(setup) -> None:
    """The peer claims 50 ids it does not serve: we ask for them once, accept nothing."""
    peer, local, engine, _ = setup
    forged = [os.urandom(32) for _ in range(50)]
    peer.reconcile_hook = lambda request: answer(infinity_range(IDLIST, encode_varint(50) + b"".join(forged)))
    before = held(local)
    result = reconcile_now(engine, engine.peers[0])
    assert result.complete and result.need == 50 and result.absent == 50 and result.accepted == 0
    assert len(peer.batch_calls) == 1
    assert held(local) == before


def test_a_forged_envelope_behind_a_claimed_id_is_rejected(setup) -> None:
    """Fingerprints lead us to ids; the envelopes behind them are verified like any pulled event."""
    peer, local, engine, evs = setup
    victim = evs[0]

    def tamper(body: dict) -> httpx.Response | None:
        for record in body["result"]:
            record["envelope"]["event"]["payload"]["title"] = "Forged"
        return httpx.Response(200, json=body)

    peer.batch_hook = tamper
    result = reconcile_now(engine, engine.peers[0])
    assert local.store.get(victim["hash"]) is None
    assert result.accepted == 0


def test_slow_rounds_stop_at_the_session_deadline(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round "takes" 30 s on the session clock: the session ends at its deadline, the pull goes on."""
    peer, local, engine, evs = setup
    now = [0.0]

    def clock() -> float:
        now[0] += 30.0
        return now[0]

    monkeypatch.setattr(reconcile, "_monotonic", clock)
    counter = iter(range(10**9))
    peer.reconcile_hook = lambda request: answer(infinity_range(FINGERPRINT, next(counter).to_bytes(16, "little")))
    result = engine.sync_peer(engine.peers[0])
    assert result.ok
    assert peer.reconcile_calls <= reconcile.SESSION_SECONDS / 30 + 1
    st = engine.state.get(peer.origin)
    assert "incomplete" in st.reconcile_note and "stopped after" in st.reconcile_note
    assert "bootstrapped" not in st.reconcile_note  # an incomplete session never moves the checkpoint
    assert held(local) == {e["hash"] for e in evs}  # pulled after_seq from 0


def test_a_flood_of_need_stops_at_the_bound(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    peer, local, engine, _ = setup
    monkeypatch.setattr(reconcile, "MAX_NEED", 120)

    def flood(request: httpx.Request) -> httpx.Response:
        ids = [os.urandom(32) for _ in range(100)]
        return answer(bytes([PROTOCOL_VERSION]) + encode_varint(1_000) + encode_varint(0) + encode_varint(IDLIST)
                      + encode_varint(100) + b"".join(ids)
                      + encode_varint(0) + encode_varint(0) + encode_varint(FINGERPRINT) + b"\x01" * 16)

    peer.reconcile_hook = flood
    result = reconcile_now(engine, engine.peers[0])
    assert not result.complete and result.need <= 200
    assert "at most 120" in (result.error or "")
    assert result.accepted == 0
