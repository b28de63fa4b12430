"""Canonical unpadded base64url (Agent Identity §4.2).

One value must have exactly one text form, otherwise string-keyed comparisons,
caches and nonce state split: a text is valid only if decoding it and encoding
the bytes again gives the same text back.
"""

from __future__ import annotations

import binascii
import re

from akrelay.protocol.errors import ProtocolError

_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")
# bytes.translate with a 256-byte table is far cheaper than str.translate.
_TO_STD = bytes.maketrans(b"-_", b"+/")
_FROM_STD = bytes.maketrans(b"+/", b"-_")


def b64encode(data: bytes) -> str:
    """Unpadded base64url text of ``data``."""
    return binascii.b2a_base64(data, newline=False).rstrip(b"=").translate(_FROM_STD).decode("ascii")



def b64decode_canonical(
    text: object, *, length: int | None = None, code: str = "invalid_event", what: str = "value"
) -> bytes:
    """Decode canonical unpadded base64url, raising ``ProtocolError(code)`` otherwise.

    Rejects non-strings, padding, characters outside the URL-safe alphabet,
    impossible lengths, non-zero trailing bits and (with ``length``) a wrong
    decoded size.
    """
    if type(text) is not str:
        raise ProtocolError(code, f"{what} must be a base64url string")
    if length is not None and len(text) != (length * 4 + 2) // 3:
        raise ProtocolError(code, f"{what} must encode exactly {length} bytes as unpadded base64url")
    if not _ALPHABET.fullmatch(text):
        raise ProtocolError(code, f"{what} must use the unpadded base64url alphabet (A-Z a-z 0-9 - _)")
    if len(text) % 4 == 1:
        raise ProtocolError(code, f"{what} has an impossible base64url length")
    try:
        data = binascii.a2b_base64((text + "=" * (-len(text) % 4)).encode("ascii").translate(_TO_STD), strict_mode=True)
    except binascii.Error as exc:  # pragma: no cover - excluded by the checks above
        raise ProtocolError(code, f"{what} is not valid base64url") from exc
    if b64encode(data) != text:
        raise ProtocolError(code, f"{what} is not canonical base64url (non-zero trailing bits)")
    if length is not None and len(data) != length:  # pragma: no cover - implied by the text length
        raise ProtocolError(code, f"{what} must encode exactly {length} bytes")
    return data


def is_canonical_b64(text: object, length: int | None = None) -> bool:
    """True when ``text`` is canonical unpadded base64url (of ``length`` bytes)."""
    try:
        b64decode_canonical(text, length=length)
    except ProtocolError:
        return False
    return True
