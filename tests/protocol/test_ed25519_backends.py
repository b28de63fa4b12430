"""libsodium and OpenSSL give the same Identity §3.1 verdict on every input we can build.

``verify_strict`` checks the equation with libsodium for speed;
``verify_strict_openssl`` checks it with ``cryptography``. Both share the
Python pre-checks, so the only thing that could differ is each library's own
treatment of the equation: cofactorless or cofactored, encodings compared or
points compared, and mixed-order keys and ``R``. The cases below are built
with a small pure-Python Edwards implementation so that they reach exactly
those places: points with a torsion component are not small-order, so the
pre-checks let them through.
"""

from __future__ import annotations

import base64
import hashlib
import random

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st

from akrelay.protocol.ed25519 import FIELD_P, GROUP_L, SMALL_ORDER_Y, verify_strict, verify_strict_openssl
from akrelay.protocol.signer import Signer

P = FIELD_P
D = (-121665 * pow(121666, P - 2, P)) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)


def _recover_x(y: int, sign: int) -> int | None:
    xx = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    x = pow(xx, (P + 3) // 8, P)
    if (x * x - xx) % P:
        x = x * SQRT_M1 % P
    if (x * x - xx) % P:
        return None
    if x == 0 and sign:
        return None
    return P - x if (x & 1) != sign else x


def _decode(encoding: bytes) -> tuple[int, int]:
    value = int.from_bytes(encoding, "little")
    y, sign = value & ((1 << 255) - 1), value >> 255
    x = _recover_x(y, sign)
    assert x is not None
    return x, y


def _encode(point: tuple[int, int]) -> bytes:
    x, y = point
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _add(p1: tuple[int, int], p2: tuple[int, int]) -> tuple[int, int]:
    (x1, y1), (x2, y2) = p1, p2
    t = D * x1 * x2 * y1 * y2 % P
    x3 = (x1 * y2 + x2 * y1) * pow(1 + t, P - 2, P) % P
    y3 = (y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P) % P
    return x3, y3


def _mul(k: int, point: tuple[int, int]) -> tuple[int, int]:
    result = (0, 1)
    while k:
        if k & 1:
            result = _add(result, point)
        point = _add(point, point)
        k >>= 1
    return result


BASE = (_recover_x(4 * pow(5, P - 2, P) % P, 0), 4 * pow(5, P - 2, P) % P)
#: A point of order 8 (one of the small-order y values, sign bit clear).
TORSION = _decode(max(y for y in SMALL_ORDER_Y if y not in (0, 1, P - 1)).to_bytes(32, "little"))


def _challenge(r_enc: bytes, a_enc: bytes, message: bytes) -> int:
    return int.from_bytes(hashlib.sha512(r_enc + a_enc + message).digest(), "little") % GROUP_L


def _scalar_point(rng: random.Random) -> tuple[int, bytes]:
    """A random scalar and the encoding of its multiple of the base point.

    The multiplication is OpenSSL's (an Ed25519 public key is [clamp(H(seed))]B),
    which keeps this module's slow affine arithmetic to single additions.
    """
    seed = rng.randbytes(32)
    digest = bytearray(hashlib.sha512(seed).digest()[:32])
    digest[0] &= 248
    digest[31] &= 127
    digest[31] |= 64
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return int.from_bytes(digest, "little"), public


def _with_torsion(encoding: bytes) -> bytes:
    return _encode(_add(_decode(encoding), TORSION))


def _sign_raw(secret: int, a_enc: bytes, message: bytes, nonce: tuple[int, bytes], torsion_r: bool = False) -> bytes:
    """A signature with a chosen nonce, optionally with a torsion component added to R."""
    r, r_enc = nonce
    if torsion_r:
        r_enc = _with_torsion(r_enc)
    s = (r + _challenge(r_enc, a_enc, message) * secret) % GROUP_L
    return r_enc + s.to_bytes(32, "little")


def _both(public_key: bytes, message: bytes, signature: bytes) -> bool:
    fast = verify_strict(public_key, message, signature)
    oracle = verify_strict_openssl(public_key, message, signature)
    assert fast == oracle, (public_key.hex(), message.hex(), signature.hex())
    return fast


def test_the_torsion_point_has_order_eight_and_the_base_point_is_standard():
    assert _mul(8, TORSION) == (0, 1) and _mul(4, TORSION) != (0, 1)
    # RFC 8032 base point: its encoding is 0x58666...66.
    assert _encode(BASE) == bytes.fromhex("58" + "66" * 31)
    # _scalar_point's scalar really is the key's discrete log: [a]B computed here equals OpenSSL's key.
    secret, a_enc = _scalar_point(random.Random(0))
    assert _encode(_mul(secret, BASE)) == a_enc


def test_honest_signatures_from_our_signer_agree_and_pass():
    for i in range(20):
        signer = Signer.from_seed(bytes([i]) * 32)
        message = hashlib.sha3_256(bytes([i])).digest()
        signature = base64.urlsafe_b64decode(signer.sign_hash(message) + "==")
        assert _both(signer.public_key, message, signature)
        assert not _both(signer.public_key, message[:-1] + bytes([message[-1] ^ 1]), signature)


def test_mixed_order_key_passes_exactly_when_the_torsion_term_vanishes():
    """Cofactorless: A' = A + T verifies an honest signature iff 8 divides the challenge k.

    Both libraries must accept the k ≡ 0 (mod 8) cases and refuse the others; a
    cofactored verifier would accept all of them.
    """
    rng = random.Random(1)
    accepted = refused = 0
    for _ in range(160):
        secret, a_enc = _scalar_point(rng)
        mixed = _with_torsion(a_enc)
        message = rng.randbytes(32)
        signature = _sign_raw(secret, mixed, message, _scalar_point(rng))
        k = _challenge(signature[:32], mixed, message)
        verdict = _both(mixed, message, signature)
        assert verdict == (k % 8 == 0)
        accepted += verdict
        refused += not verdict
    assert accepted and refused


def test_mixed_order_r_is_refused_by_both():
    rng = random.Random(2)
    for _ in range(40):
        secret, a_enc = _scalar_point(rng)
        message = rng.randbytes(32)
        signature = _sign_raw(secret, a_enc, message, _scalar_point(rng), torsion_r=True)
        assert not _both(a_enc, message, signature)


def test_unreduced_s_and_small_order_points_are_refused_by_both():
    rng = random.Random(3)
    secret, a_enc = _scalar_point(rng)
    message = b"m" * 32
    signature = _sign_raw(secret, a_enc, message, _scalar_point(rng))
    assert _both(a_enc, message, signature)
    s = int.from_bytes(signature[32:], "little")
    assert not _both(a_enc, message, signature[:32] + (s + GROUP_L).to_bytes(32, "little"))
    for y in SMALL_ORDER_Y:
        enc = y.to_bytes(32, "little")
        assert not _both(enc, message, signature)
        assert not _both(a_enc, message, enc + signature[32:])


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.binary(max_size=64), st.integers(0, 511), st.sampled_from(["sig", "key", "msg"]))
def test_single_bit_flips_get_the_same_verdict(seed, message, bit, where):
    private = Ed25519PrivateKey.from_private_bytes(seed)
    signature = bytearray(private.sign(message))
    public_key = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    key = bytearray(public_key)
    msg = bytearray(message)
    if where == "sig":
        signature[bit // 8 % 64] ^= 1 << (bit % 8)
    elif where == "key":
        key[bit // 8 % 32] ^= 1 << (bit % 8)
    elif msg:
        msg[bit // 8 % len(msg)] ^= 1 << (bit % 8)
    _both(bytes(key), bytes(msg), bytes(signature))


@pytest.mark.parametrize("y", sorted(SMALL_ORDER_Y))
def test_every_small_order_key_is_refused_with_an_otherwise_valid_equation(y):
    # With A of small order, [k]A is torsion; S = r makes the cofactored equation hold.
    rng = random.Random(y % 1000)
    nonce, r_enc = _scalar_point(rng)
    signature = r_enc + (nonce % GROUP_L).to_bytes(32, "little")
    assert not _both(y.to_bytes(32, "little"), b"msg", signature)
