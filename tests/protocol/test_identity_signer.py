"""Signer, event builders and NonceClock (Identity §5, §6.2)."""

from __future__ import annotations

import secrets

import pytest

from akrelay.protocol.envelope import event_hash, validate_event_fields, verify_hash_and_signature
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.signer import MAX_NONCE_JUMP, NonceClock, Signer, assess_event, publish_event, retract_event


def test_clock_derived_nonces_stay_monotonic():
    clock = NonceClock()
    assert clock.next(1_000) == 1_000
    assert clock.next(1_000) == 1_001  # two events in one millisecond
    assert clock.next(900) == 1_002  # a clock step back never reuses a nonce
    assert clock.next() == 1_003  # without a clock it counts
    assert clock.next(5_000) == 5_000
    assert clock.peek() == 5_001


def test_nonce_sequence_exhaustion_is_an_error():
    clock = NonceClock(2**53 - 1)
    assert clock.next() == 2**53 - 1
    with pytest.raises(ProtocolError):
        clock.next()
    for bad in (0, -1, 2**53, 1.0, True):
        with pytest.raises(ValueError):
            NonceClock(bad)


@pytest.mark.parametrize("header", ["", "+5", "-5", " 5", "5 ", "1.0", "1e3", "０", "12345678901234567", "9007199254740992", None, 5])
def test_malformed_max_seen_nonce_headers_change_nothing(header):
    clock = NonceClock(10)
    with pytest.raises(ProtocolError) as err:
        clock.observe_max_seen_nonce(header, 1_000)
    assert err.value.code == "invalid_response"
    assert clock.peek() == 10


def test_max_seen_nonce_bound_follows_the_clock_and_the_sequence():
    clock = NonceClock(10)
    # The bound is 2^32 beyond max(next_nonce, now_ms): a later clock allows a larger header.
    assert clock.observe_max_seen_nonce(str(10**6 + MAX_NONCE_JUMP), 10**6) == 10**6 + MAX_NONCE_JUMP + 1
    clock = NonceClock(10**7)
    assert clock.observe_max_seen_nonce(str(10**7 + MAX_NONCE_JUMP), 0) == 10**7 + MAX_NONCE_JUMP + 1
    with pytest.raises(ProtocolError):
        NonceClock(10**7).observe_max_seen_nonce(str(10**7 + MAX_NONCE_JUMP + 1), 0)


def test_event_builders_produce_closed_six_field_events():
    signer = Signer.from_seed(bytes(range(32)))
    for build, kind in ((publish_event, "publish"), (assess_event, "assess"), (retract_event, "retract")):
        event = build(signer.agent_id, 5, 6, {"x": 1})
        assert event == {
            "protocol": "agent-knowledge/1.0", "type": f"knowledge.{kind}", "actor": signer.agent_id,
            "created_at": 5, "nonce": 6, "payload": {"x": 1},
        }
        validate_event_fields(event)
        envelope = signer.sign(event)
        assert envelope["hash"] == event_hash(event)
        assert verify_hash_and_signature(envelope) == envelope["hash"]


def test_signer_keys():
    signer = Signer.from_seed(bytes([7]) * 32)
    assert signer.seed == bytes([7]) * 32
    assert signer.agent_id == "did:agent:6kpsY-KcUgq-9VB7Ey7F-ZVHdq6-vnuSQh7qaRRG0iw"
    assert Signer.generate(secrets.token_bytes).agent_id != Signer.generate(secrets.token_bytes).agent_id
    with pytest.raises(ValueError):
        Signer.from_seed(b"short")
