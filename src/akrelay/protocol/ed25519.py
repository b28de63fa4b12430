"""Deterministic Ed25519 verification (Agent Identity §3.1).

RFC 8032 leaves verifiers free on non-canonical and small-order points and on
the cofactor, so two libraries can disagree about one archive. Identity §3.1
removes that freedom; ``cryptography`` (OpenSSL) already uses the cofactorless
equation and rejects ``S >= L``, but it accepts non-canonical and small-order
public keys and small-order ``R``, so those checks are made here first.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

#: The field prime p = 2^255 − 19 and the group order L.
FIELD_P = 2**255 - 19
GROUP_L = 2**252 + 27742317777372353535851937790883648493
_Y_MASK = 2**255 - 1

#: y-coordinates (sign bit cleared) of the small-order points, Appendix B.
SMALL_ORDER_Y = frozenset(
    {
        0,
        1,
        FIELD_P - 1,
        int.from_bytes(bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"), "little"),
        int.from_bytes(bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"), "little"),
    }
)


def is_strict_point_encoding(encoding: bytes) -> bool:
    """Rules 1–2: canonical (y < p) and not one of the small-order points."""
    if len(encoding) != 32:
        return False
    y = int.from_bytes(encoding, "little") & _Y_MASK
    return y < FIELD_P and y not in SMALL_ORDER_Y


@lru_cache(maxsize=4096)
def _public_key(raw: bytes) -> Ed25519PublicKey | None:
    # Parsing the key decompresses the point; caching saves that on every event
    # from an actor we have seen recently.
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def verify_strict(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True exactly when ``signature`` is valid for ``message`` under Identity §3.1."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    public_key = bytes(public_key)
    signature = bytes(signature)
    if not is_strict_point_encoding(public_key) or not is_strict_point_encoding(signature[:32]):
        return False
    if int.from_bytes(signature[32:], "little") >= GROUP_L:
        return False
    key = _public_key(public_key)
    if key is None:
        return False
    try:
        key.verify(signature, bytes(message))
    except InvalidSignature:
        return False
    return True
