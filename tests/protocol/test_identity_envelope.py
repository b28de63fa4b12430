"""verify_envelope (Knowledge §8.1 step 1), Envelope, from_trusted, and the identity-level API."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import jsonschema
import pytest
import rfc8785

from akrelay.protocol.envelope import Envelope, event_hash, verify_envelope, verify_hash_and_signature
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.options import ValidationOptions
from akrelay.protocol.signer import Signer, publish_event, retract_event

from identity_support import FIXTURES, KNOWLEDGE, apply_changes, fixture_envelope, fixture_signer, to_bytes

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "agent-knowledge-1.0.schema.json").read_text())
ENVELOPE_SCHEMA = jsonschema.Draft202012Validator({**SCHEMA, "$ref": "#/$defs/signedEnvelope"})
ORIGINAL = "original"


def _code(raw, **kwargs) -> str:
    with pytest.raises(ProtocolError) as err:
        verify_envelope(raw, **kwargs)
    return err.value.code


# -- the knowledge vectors ----------------------------------------------------------


@pytest.mark.parametrize("case", KNOWLEDGE["identity_cases"], ids=lambda c: c["name"])
def test_identity_cases(case):
    if "raw_json" in case:
        raw = case["raw_json"].encode("utf-8")
    else:
        raw = to_bytes(apply_changes(fixture_envelope(case["fixture"]), case.get("changes", [])))
    assert _code(raw) == case["expected"]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_fixture_verifies_exactly_when_it_is_schema_valid(name):
    fixture = FIXTURES[name]
    item = fixture["envelope"]
    schema_valid = ENVELOPE_SCHEMA.is_valid(item)
    if not schema_valid:
        assert _code(to_bytes(item)) == "invalid_event"
        return
    for raw in (to_bytes(item), json.dumps(item), item, bytearray(to_bytes(item))):
        envelope = verify_envelope(raw)
        assert envelope.id == item["hash"]
        assert envelope.signature == item["signature"]
        assert envelope.event == item["event"]
        assert envelope.event_jcs == fixture["canonical_event_utf8"].encode("utf-8")
    assert envelope.to_dict() == item
    assert envelope.canonical_bytes() == rfc8785.dumps(item)
    assert event_hash(item["event"]) == item["hash"]
    assert verify_hash_and_signature(item) == item["hash"]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_from_trusted_round_trips_canonical_bytes(name):
    item = FIXTURES[name]["envelope"]
    data = rfc8785.dumps(item)
    envelope = Envelope.from_trusted(data)
    assert (envelope.id, envelope.signature, envelope.event) == (item["hash"], item["signature"], item["event"])
    assert envelope.canonical_bytes() == data
    assert envelope.type == item["event"]["type"] and envelope.nonce == item["event"]["nonce"]


@pytest.mark.parametrize("data", [b"", b"{}", b'{"event":{}}', b"x" * 400, rfc8785.dumps(FIXTURES[ORIGINAL]["envelope"])[:-1]])
def test_from_trusted_refuses_other_layouts(data):
    with pytest.raises(ValueError):
        Envelope.from_trusted(data)


# -- every error path of step 1 ---------------------------------------------------------------

SHAPE_MUTATIONS = [
    ("envelope not an object", lambda e: [e], "envelope must be a JSON object"),
    ("missing hash", lambda e: {k: v for k, v in e.items() if k != "hash"}, "missing required field 'hash'"),
    ("missing event", lambda e: {k: v for k, v in e.items() if k != "event"}, "missing required field 'event'"),
    ("unknown envelope field", lambda e: {**e, "extra": 1}, "unknown field 'extra'"),
    ("hash not a string", lambda e: {**e, "hash": 5}, "envelope.hash"),
    ("hash too short", lambda e: {**e, "hash": e["hash"][:-1]}, "envelope.hash"),
    ("hash padded", lambda e: {**e, "hash": e["hash"][:-1] + "="}, "envelope.hash"),
    ("signature too long", lambda e: {**e, "signature": e["signature"] + "A"}, "envelope.signature"),
    ("signature standard alphabet", lambda e: {**e, "signature": "+" + e["signature"][1:]}, "envelope.signature"),
    ("event not an object", lambda e: {**e, "event": "x"}, "envelope.event must be an object"),
    ("event missing nonce", lambda e: {**e, "event": {k: v for k, v in e["event"].items() if k != "nonce"}}, "'nonce'"),
    ("unknown event field", lambda e: {**e, "event": {**e["event"], "room_id": "r"}}, "unknown field 'room_id'"),
    ("other protocol", lambda e: {**e, "event": {**e["event"], "protocol": "agent-profile/1.0"}}, "event.protocol"),
    ("unknown type", lambda e: {**e, "event": {**e["event"], "type": "knowledge.delete"}}, "event.type"),
    ("type not a string", lambda e: {**e, "event": {**e["event"], "type": ["knowledge.publish"]}}, "event.type"),
    ("actor padded", lambda e: {**e, "event": {**e["event"], "actor": e["event"]["actor"] + "="}}, "event.actor"),
    ("actor wrong prefix", lambda e: {**e, "event": {**e["event"], "actor": "did:key:" + e["event"]["actor"][10:]}}, "event.actor"),
    ("created_at negative", lambda e: {**e, "event": {**e["event"], "created_at": -1}}, "created_at"),
    ("created_at bool", lambda e: {**e, "event": {**e["event"], "created_at": True}}, "created_at must be a JSON integer"),
    ("created_at string", lambda e: {**e, "event": {**e["event"], "created_at": "1"}}, "created_at must be a JSON integer"),
    ("created_at fraction", lambda e: {**e, "event": {**e["event"], "created_at": 1.5}}, "created_at must be a JSON integer"),
    ("nonce zero", lambda e: {**e, "event": {**e["event"], "nonce": 0}}, "nonce must be in 1..2^53-1"),
    ("nonce bool", lambda e: {**e, "event": {**e["event"], "nonce": True}}, "nonce must be a JSON integer"),
    ("payload array", lambda e: {**e, "event": {**e["event"], "payload": []}}, "payload must be an object"),
    ("payload unknown member", lambda e: {**e, "event": {**e["event"], "payload": {**e["event"]["payload"], "x": 1}}}, "payload"),
]


@pytest.mark.parametrize(("name", "mutate", "message"), SHAPE_MUTATIONS, ids=[m[0] for m in SHAPE_MUTATIONS])
def test_shape_errors_are_invalid_event_with_a_clear_message(name, mutate, message):
    raw = to_bytes(mutate(fixture_envelope(ORIGINAL)))
    with pytest.raises(ProtocolError) as err:
        verify_envelope(raw)
    assert err.value.code == "invalid_event"
    assert message in err.value.message


def test_nonce_above_the_safe_range_is_rejected_by_the_parser():
    raw = to_bytes(fixture_envelope(ORIGINAL)).replace(b'"nonce": 1', b'"nonce": 9007199254740992', 1)
    assert b"9007199254740992" in raw
    assert _code(raw) == "invalid_event"


def test_non_json_inputs_are_invalid_event():
    for raw in (None, 5, [], b"\xff", "", {"hash": float("nan")}, {"hash": object()}):
        assert _code(raw) == "invalid_event"


def test_hash_mismatch_is_invalid_event_hash():
    envelope = fixture_envelope(ORIGINAL)
    envelope["event"]["nonce"] += 1
    assert _code(to_bytes(envelope)) == "invalid_event_hash"


def test_non_canonical_hash_spelling_is_invalid_event_hash():
    envelope = fixture_envelope(ORIGINAL)
    last = envelope["hash"][-1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    # Same decoded bytes, non-zero trailing bits: still not the hash.
    envelope["hash"] = envelope["hash"][:-1] + alphabet[alphabet.index(last) | 1]
    assert _code(to_bytes(envelope)) == "invalid_event_hash"


def test_non_canonical_signature_spelling_is_invalid_signature():
    envelope = fixture_envelope(ORIGINAL)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = envelope["signature"][-1]
    envelope["signature"] = envelope["signature"][:-1] + alphabet[alphabet.index(last) | 1]
    with pytest.raises(ProtocolError) as err:
        verify_envelope(to_bytes(envelope))
    assert err.value.code == "invalid_signature"
    assert "canonical" in err.value.message


def test_signature_by_another_key_is_invalid_signature():
    envelope = fixture_envelope(ORIGINAL)
    forged = Signer.from_seed(bytes([5]) * 32).sign(envelope["event"])
    assert forged["hash"] == envelope["hash"]
    assert _code(to_bytes(forged)) == "invalid_signature"


def test_non_canonical_actor_fails_when_decoded_after_the_hash():
    # Identity §6.1: the hash (step 3) comes before decoding the actor (step 4).
    envelope = fixture_envelope(ORIGINAL)
    envelope["event"]["actor"] = envelope["event"]["actor"][:-1] + "t"  # 's' -> 't': non-zero trailing bits
    assert _code(to_bytes(envelope)) == "invalid_event_hash"
    envelope["hash"] = event_hash(envelope["event"])
    with pytest.raises(ProtocolError) as err:
        verify_envelope(to_bytes(envelope))
    assert err.value.code == "invalid_event"
    assert "actor" in err.value.message and "canonical" in err.value.message


def test_small_order_actor_cannot_sign():
    # The identity point as actor with R = identity, S = 0 verifies any message under a lenient verifier.
    identity = "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    envelope = fixture_envelope(ORIGINAL)
    envelope["event"]["actor"] = "did:agent:" + identity
    envelope["hash"] = event_hash(envelope["event"])
    envelope["signature"] = identity + "A" * 43
    assert _code(to_bytes(envelope)) == "invalid_signature"


# -- numbers and characters that take the full JCS path -------------------------------------


def _signed(payload_changes: dict, text_edit=None) -> tuple[dict, bytes]:
    envelope = fixture_envelope(ORIGINAL)
    envelope["event"]["payload"].update(payload_changes)
    signed = fixture_signer(ORIGINAL).sign(envelope["event"])
    raw = to_bytes(signed)
    return signed, raw if text_edit is None else text_edit(raw)


def test_non_integral_numbers_in_extra_use_ecmascript_serialization():
    signed, raw = _signed({"extra": {"ratio": 0.1, "tiny": 1e-7, "big": 4503599627370495.5, "neg": -2.5}})
    envelope = verify_envelope(raw)
    assert envelope.event_jcs == rfc8785.dumps(signed["event"])
    assert b'"tiny":1e-7' in envelope.event_jcs and b'"big":4503599627370495.5' in envelope.event_jcs


def test_astral_member_names_sort_by_utf16_code_units():
    signed, raw = _signed({"extra": {"\ue000": 1, "😀": 2, "a": 3}})
    envelope = verify_envelope(raw)
    assert envelope.event_jcs == rfc8785.dumps(signed["event"])
    assert envelope.event_jcs.index("😀".encode()) < envelope.event_jcs.index("\ue000".encode())
    ascii_raw = json.dumps(signed, ensure_ascii=True).encode()
    assert verify_envelope(ascii_raw).event_jcs == envelope.event_jcs


def test_integral_number_spellings_carry_the_same_event_id():
    item = fixture_envelope(ORIGINAL)
    nonce = item["event"]["nonce"]
    raw = to_bytes(item).replace(f'"nonce": {nonce}'.encode(), f'"nonce": {nonce}.0'.encode(), 1)
    assert f"{nonce}.0".encode() in raw
    envelope = verify_envelope(raw)
    assert envelope.id == item["hash"] and type(envelope.nonce) is int


# -- the legacy retraction switch --------------------------------------------------------------


def test_legacy_retraction_without_license_is_a_switch():
    from akrelay.protocol.payload import check_payload_rules

    signer = Signer.from_seed(bytes.fromhex(KNOWLEDGE["seeds"]["publisher"]))
    event = retract_event(signer.agent_id, 1000, 10**6, {"target": FIXTURES[ORIGINAL]["envelope"]["hash"], "reason": "wrong"})
    raw = to_bytes(signer.sign(event))
    check_payload_rules(verify_envelope(raw))
    strict = ValidationOptions(allow_legacy_retract=False)
    with pytest.raises(ProtocolError) as err:
        check_payload_rules(verify_envelope(raw, options=strict), strict)
    assert err.value.code == "invalid_event" and "license" in err.value.message


def test_signer_builds_envelopes_that_verify():
    signer = Signer.generate(secrets.token_bytes)
    payload = fixture_envelope(ORIGINAL)["event"]["payload"]
    envelope = verify_envelope(to_bytes(signer.sign(publish_event(signer.agent_id, 5, 7, payload))))
    assert (envelope.actor, envelope.created_at, envelope.nonce, envelope.type) == (signer.agent_id, 5, 7, "knowledge.publish")


# -- identity-level API for other protocols ---------------------------------------------------------


def test_verify_hash_and_signature_error_codes():
    item = fixture_envelope(ORIGINAL)
    for bad, code in [
        ([], "invalid_event"),
        ({**item, "x": 1}, "invalid_event"),
        ({**item, "event": []}, "invalid_event"),
        ({**item, "hash": 1}, "invalid_event"),
        ({**item, "event": {**item["event"], "actor": "someone"}}, "invalid_event"),
        ({**item, "event": {**item["event"], "payload": {"x": float("nan")}}}, "invalid_event"),
        ({**item, "event": {**item["event"], "nonce": 2}}, "invalid_event_hash"),
        ({**item, "signature": "A" * 86}, "invalid_signature"),
        ({**item, "signature": "A" * 85}, "invalid_signature"),
    ]:
        with pytest.raises(ProtocolError) as err:
            verify_hash_and_signature(bad)
        assert err.value.code == code, bad
