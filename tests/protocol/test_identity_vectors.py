"""Every case of tests/vectors/agent-identity-1.0.vectors.json (Identity Appendix A)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from akrelay.protocol.agent_id import agent_id_from_public_key, is_agent_id, public_key_from_agent_id
from akrelay.protocol.b64 import b64decode_canonical, b64encode
from akrelay.protocol.ed25519 import verify_strict
from akrelay.protocol.envelope import event_hash, validate_event_fields, verify_hash_and_signature
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import parse_strict
from akrelay.protocol.jcs import canonicalize, canonicalize_reference
from akrelay.protocol.signer import NonceClock, Signer

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "agent-identity-1.0.vectors.json").read_text(encoding="utf-8")
)


def _b64(text: str) -> bytes:
    return b64decode_canonical(text)


@pytest.mark.parametrize("key", VECTORS["keys"], ids=lambda k: k["name"])
def test_keys_reproduce_public_key_and_agent_id(key):
    signer = Signer.from_seed(bytes.fromhex(key["seed"]))
    assert b64encode(signer.public_key) == key["public_key"]
    assert signer.agent_id == key["agent_id"]
    assert agent_id_from_public_key(signer.public_key) == key["agent_id"]
    assert public_key_from_agent_id(key["agent_id"]) == signer.public_key


@pytest.mark.parametrize("vector", VECTORS["events"], ids=lambda v: v["name"])
def test_events_reproduce_jcs_hash_and_signature_byte_for_byte(vector):
    signer = Signer.from_seed(bytes.fromhex(vector["seed"]))
    expected_jcs = vector["jcs"].encode("utf-8")
    assert canonicalize(vector["event"]) == expected_jcs
    assert canonicalize_reference(vector["event"]) == expected_jcs
    assert event_hash(vector["event"]) == vector["hash"]
    envelope = signer.sign(vector["event"])
    assert envelope["hash"] == vector["hash"]
    assert envelope["signature"] == vector["signature"]
    assert verify_hash_and_signature(envelope) == vector["hash"]
    # The JCS text is itself strict I-JSON and parses back to the event.
    assert parse_strict(vector["jcs"]) == vector["event"]
    assert parse_strict(expected_jcs) == vector["event"]


def test_events_closed_shape_allows_only_protocol_defined_extra_fields():
    first, second = VECTORS["events"][0]["event"], VECTORS["events"][1]["event"]
    validate_event_fields(first)
    validate_event_fields(second, ["room_id", "base_seq", "base_hash", "mentions"])
    with pytest.raises(ProtocolError) as err:
        validate_event_fields(second)
    assert err.value.code == "invalid_event"
    assert "unknown field" in err.value.message


@pytest.mark.parametrize("vector", VECTORS["events_closed_shape"]["invalid"], ids=lambda v: v["name"])
def test_events_closed_shape_invalid(vector):
    with pytest.raises(ProtocolError) as err:
        validate_event_fields(vector["event"])
    assert err.value.code == "invalid_event"


@pytest.mark.parametrize("vector", VECTORS["signatures"], ids=lambda v: v["name"])
def test_only_strictly_valid_signatures_verify(vector):
    public_key, message = _b64(vector["public_key"]), _b64(vector["message"])
    signature = _b64(vector["signature"])
    assert verify_strict(public_key, message, signature) is vector["valid"]


def test_honest_signature_fails_on_any_flipped_bit():
    vector = VECTORS["signatures"][0]
    public_key, message, signature = (_b64(vector[k]) for k in ("public_key", "message", "signature"))
    for index in range(64):
        for bit in (1, 128):
            mutated = bytearray(signature)
            mutated[index] ^= bit
            assert not verify_strict(public_key, message, bytes(mutated)), (index, bit)


@pytest.mark.parametrize("agent_id", VECTORS["agent_ids"]["valid"])
def test_valid_agent_ids(agent_id):
    assert is_agent_id(agent_id)
    assert agent_id_from_public_key(public_key_from_agent_id(agent_id)) == agent_id


@pytest.mark.parametrize("vector", VECTORS["agent_ids"]["invalid"], ids=lambda v: v["name"])
def test_invalid_agent_ids(vector):
    assert not is_agent_id(vector["value"])
    with pytest.raises(ProtocolError) as err:
        public_key_from_agent_id(vector["value"], code="invalid_actor")
    assert err.value.code == "invalid_actor"


@pytest.mark.parametrize("vector", VECTORS["json"]["valid"], ids=lambda v: v["name"])
def test_valid_json_texts(vector):
    assert parse_strict(vector["text"]) == json.loads(vector["text"])
    assert parse_strict(vector["text"].encode("utf-8")) == json.loads(vector["text"])


@pytest.mark.parametrize("vector", VECTORS["json"]["invalid"], ids=lambda v: v["name"])
def test_invalid_json_texts(vector):
    json.loads(vector["text"])  # the lenient stdlib parser accepts every one of them
    for data in (vector["text"], vector["text"].encode("utf-8")):
        with pytest.raises(ProtocolError) as err:
            parse_strict(data)
        assert err.value.code == "invalid_event"
        assert err.value.message.startswith("invalid JSON")
    with pytest.raises(ProtocolError) as err:
        parse_strict(vector["text"], code="invalid_request")
    assert err.value.code == "invalid_request"


@pytest.mark.parametrize("vector", VECTORS["max_seen_nonce"], ids=lambda v: v["name"])
def test_max_seen_nonce_jumps_are_bounded(vector):
    clock = NonceClock(vector["next_nonce"])
    if vector["accepted"]:
        assert clock.observe_max_seen_nonce(vector["header"], vector["now_ms"]) == vector["next_after"]
        assert clock.peek() == vector["next_after"]
    else:
        with pytest.raises(ProtocolError) as err:
            clock.observe_max_seen_nonce(vector["header"], vector["now_ms"])
        assert "jumps too far" in err.value.message
        assert clock.peek() == vector["next_nonce"]
