"""Evidence digest checks (Agent Knowledge §5.1).

A local result, never a payload field: the caller fetches (or fails to fetch)
the complete representation; this only compares bytes, so it stays pure.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Literal

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import is_canonical_id

EvidenceStatus = Literal["unchecked", "matched", "mismatched", "unavailable"]


def digest_of(representation: bytes) -> str:
    """The SHA3-256 digest of exact bytes, encoded like an event hash."""
    return base64.urlsafe_b64encode(hashlib.sha3_256(representation).digest()).rstrip(b"=").decode("ascii")


def verify_evidence(digest: str | None, representation: bytes | None) -> EvidenceStatus:
    """``unchecked`` without a digest, ``unavailable`` without the complete bytes,
    else ``matched`` or ``mismatched``. Pass the bytes after removing transfer and
    content codings, before any character or newline conversion."""
    if digest is None:
        return "unchecked"
    if not is_canonical_id(digest):
        raise ProtocolError("invalid_event", "evidence digest must canonically encode 32 bytes")
    if representation is None:
        return "unavailable"
    if not isinstance(representation, (bytes, bytearray, memoryview)):
        raise TypeError("representation must be bytes, before character or newline conversion")
    return "matched" if digest_of(bytes(representation)) == digest else "mismatched"
