"""Opaque, authenticated continuation cursors for LIST and SEARCH (§44.8, §88.4).

A cursor binds its family, the exact command and parameters it continues (a
digest) and the snapshot it reads, so a page 2 is computed at the same
``space_seq`` as page 1 and cannot be replayed against another query.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from akrelay.kip.errors import KipError


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"akrelay-kip-cursor-v1", hashlib.sha256).digest()

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:16]

    def encode(self, family: str, binding: Any, seq: int, offset: int) -> str:
        body = json.dumps({"f": family, "b": _digest(binding), "s": seq, "o": offset},
                          separators=(",", ":")).encode()
        return _b64(body) + "." + _b64(self._mac(body))

    def decode(self, token: str, family: str, binding: Any) -> tuple[int, int]:
        """``(seq, offset)`` of a cursor issued for exactly this family and binding."""
        try:
            body_text, mac_text = token.split(".")
            body = _unb64(body_text)
            ok = hmac.compare_digest(self._mac(body), _unb64(mac_text))
            doc = json.loads(body) if ok else None
        except (ValueError, TypeError):
            doc = None
        if not isinstance(doc, dict):
            raise KipError("CursorInvalid", "the cursor is not one this runtime issued",
                           details={"family": family.lower(), "reason": "malformed"})
        if doc.get("f") != family:
            raise KipError("CursorTypeMismatch", f"the cursor continues a {doc.get('f')} traversal, not {family}",
                           details={"family": family.lower()})
        if doc.get("b") != _digest(binding):
            raise KipError("CursorMismatch", "the cursor belongs to a different command or parameters",
                           details={"family": family.lower()})
        return int(doc["s"]), int(doc["o"])


def _digest(binding: Any) -> str:
    return hashlib.sha256(json.dumps(binding, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()[:32]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
