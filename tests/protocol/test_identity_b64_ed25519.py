"""Canonical base64url, Agent IDs and the Identity §3.1 Ed25519 pre-checks."""

from __future__ import annotations

import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akrelay.protocol.agent_id import agent_id_from_public_key, is_agent_id, public_key_from_agent_id
from akrelay.protocol.b64 import b64decode_canonical, b64encode, is_canonical_b64
from akrelay.protocol.ed25519 import FIELD_P, GROUP_L, SMALL_ORDER_Y, is_strict_point_encoding, verify_strict
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.signer import Signer


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=100))
def test_b64_round_trip_matches_stdlib(data):
    text = b64encode(data)
    assert text == base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    assert b64decode_canonical(text) == data


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/ .", max_size=50))
def test_b64_accepts_exactly_the_texts_that_round_trip(text):
    # Independent oracle: the stdlib decoder with padding added, then the re-encoding test.
    expected = None
    if all(c.isalnum() and c.isascii() or c in "-_" for c in text) and len(text) % 4 != 1:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        if base64.urlsafe_b64encode(data).rstrip(b"=").decode() == text:
            expected = data
    if expected is None:
        with pytest.raises(ProtocolError) as err:
            b64decode_canonical(text, code="invalid_request")
        assert err.value.code == "invalid_request"
        assert not is_canonical_b64(text)
    else:
        assert b64decode_canonical(text) == expected


@pytest.mark.parametrize(
    ("text", "length", "reason"),
    [
        ("AAAA=", None, "alphabet"),
        ("AA==", None, "alphabet"),
        ("A+/A", None, "alphabet"),
        ("AAAAA", None, "impossible"),
        ("AB", None, "trailing bits"),
        ("AAF", None, "trailing bits"),
        ("AAAA", 32, "exactly 32 bytes"),
        (b"AAAA", None, "string"),
        (None, None, "string"),
    ],
)
def test_b64_rejections_name_the_defect(text, length, reason):
    with pytest.raises(ProtocolError) as err:
        b64decode_canonical(text, length=length, code="invalid_event", what="digest")
    assert err.value.code == "invalid_event"
    assert reason in err.value.message
    assert "digest" in err.value.message


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=32, max_size=32))
def test_agent_id_round_trip(key):
    agent_id = agent_id_from_public_key(key)
    assert agent_id.startswith("did:agent:") and len(agent_id) == 53
    assert public_key_from_agent_id(agent_id) == key
    assert is_agent_id(agent_id)
    assert not is_agent_id(agent_id + "A")
    assert not is_agent_id("DID:AGENT:" + agent_id[10:])


def test_agent_id_rejects_non_strings_and_wrong_key_sizes():
    for value in (None, 7, b"did:agent:" + b"A" * 43, "did:agent:", "did:agent:" + "A" * 42):
        assert not is_agent_id(value)
    with pytest.raises(ValueError):
        agent_id_from_public_key(b"\0" * 31)


def _encode_y(y: int, sign: int = 0) -> bytes:
    return (y | (sign << 255)).to_bytes(32, "little")


@pytest.mark.parametrize("y", sorted(SMALL_ORDER_Y))
@pytest.mark.parametrize("sign", [0, 1])
def test_small_order_points_are_refused(y, sign):
    assert not is_strict_point_encoding(_encode_y(y, sign))


@pytest.mark.parametrize("y", [FIELD_P, FIELD_P + 1, 2**255 - 1])
def test_non_canonical_y_is_refused(y):
    assert not is_strict_point_encoding(_encode_y(y))


def test_ordinary_point_passes_the_pre_checks():
    signer = Signer.from_seed(bytes([7]) * 32)
    assert is_strict_point_encoding(signer.public_key)


def _honest():
    signer = Signer.from_seed(bytes([9]) * 32)
    message = bytes(range(32))
    signature = base64.urlsafe_b64decode(signer.sign_hash(message) + "==")
    return signer.public_key, message, signature


def test_verify_strict_accepts_honest_and_rejects_unreduced_s():
    public_key, message, signature = _honest()
    assert verify_strict(public_key, message, signature)
    s = int.from_bytes(signature[32:], "little")
    unreduced = signature[:32] + (s + GROUP_L).to_bytes(32, "little")
    assert not verify_strict(public_key, message, unreduced)


def test_verify_strict_rejects_small_order_r_and_key_and_wrong_sizes():
    public_key, message, signature = _honest()
    identity = _encode_y(1)
    assert not verify_strict(public_key, message, identity + signature[32:])
    assert not verify_strict(identity, message, identity + bytes(32))
    assert not verify_strict(public_key[:31], message, signature)
    assert not verify_strict(public_key, message, signature[:63])
    assert not verify_strict(public_key, message + b"x", signature)


def test_verify_strict_rejects_a_key_that_is_not_a_curve_point():
    # y = 2 is canonical and not small-order but has no x on the curve.
    assert is_strict_point_encoding(_encode_y(2))
    _, message, signature = _honest()
    assert not verify_strict(_encode_y(2), message, signature)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_signer_signatures_verify_and_bind_the_message(seed, message):
    signer = Signer.from_seed(seed)
    signature = base64.urlsafe_b64decode(signer.sign_hash(message) + "==")
    assert verify_strict(signer.public_key, message, signature)
    other = bytes([message[0] ^ 1]) + message[1:]
    assert not verify_strict(signer.public_key, other, signature)
