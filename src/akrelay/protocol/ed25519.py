"""Deterministic Ed25519 verification (Agent Identity §3.1).

RFC 8032 leaves verifiers free on non-canonical and small-order points and on
the cofactor, so two libraries can disagree about one archive. Identity §3.1
removes that freedom. The canonical-encoding, small-order and ``S < L`` checks
are made here first, in Python, so the verdict never depends on a library's
own leniency; the equation itself is then checked by libsodium (PyNaCl), which
uses the cofactorless equation and compares encodings, as §3.1 requires.

Why libsodium and not ``cryptography`` (OpenSSL), which we also ship: on the
project machine it verifies in ≈ 106 µs against OpenSSL's ≈ 176 µs, and
verification is the largest single cost of an acceptance (see
docs/benchmarks.md). :func:`verify_strict_openssl` keeps the OpenSSL path as a
differential oracle for the tests.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

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
    # Parsing the key decompresses the point; caching saves that when the
    # oracle checks many signatures by one key.
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def _pre_checks(public_key: bytes, signature: bytes) -> bool:
    """Identity §3.1 rules that do not need the curve arithmetic."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    if not is_strict_point_encoding(public_key) or not is_strict_point_encoding(signature[:32]):
        return False
    return int.from_bytes(signature[32:], "little") < GROUP_L


def verify_strict(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True exactly when ``signature`` is valid for ``message`` under Identity §3.1."""
    public_key = bytes(public_key)
    signature = bytes(signature)
    if not _pre_checks(public_key, signature):
        return False
    try:
        # crypto_sign_open is libsodium's verify_detached over ``signature || message``.
        crypto_sign_open(signature + bytes(message), public_key)
    except BadSignatureError:
        return False
    return True


def verify_strict_openssl(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """The same verdict through ``cryptography`` (OpenSSL): the tests' differential oracle."""
    public_key = bytes(public_key)
    signature = bytes(signature)
    if not _pre_checks(public_key, signature):
        return False
    key = _public_key(public_key)
    if key is None:
        return False
    try:
        key.verify(signature, bytes(message))
    except InvalidSignature:
        return False
    return True
