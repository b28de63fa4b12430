"""Opaque, authenticated continuation cursors for LIST, SEARCH and KQL (§44.8, §87.7, §88.4).

A cursor binds its family, the exact command and parameters it continues (a
digest) and the snapshot it reads, so a page 2 is computed at the same
``space_seq`` as page 1 and cannot be replayed against another query. Every
family shares one token format and key, so a cursor from one family is
recognised — and refused with ``CursorTypeMismatch`` — by every other. The
sealing itself is the protocol core's :class:`~akrelay.protocol.cursor.Sealer`.
"""

from __future__ import annotations

import hashlib
import json
from akrelay.kip.errors import KipError
from akrelay.protocol.cursor import Sealer, SealError


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._sealer = Sealer(secret, b"akrelay-kip-cursor-v1")

    def encode(self, family: str, binding: object, seq: int, offset: int, *, expires_at_ms: int | None = None) -> str:
        doc: dict[str, int | str] = {"f": family, "b": _digest(binding), "s": seq, "o": offset}
        if expires_at_ms is not None:
            doc["x"] = expires_at_ms
        return self._sealer.seal(json.dumps(doc, separators=(",", ":")).encode())

    def decode(self, token: str, family: str, binding: object, *, now_ms: int | None = None) -> tuple[int, int]:
        """``(seq, offset)`` of a cursor issued for exactly this family and binding.

        With ``now_ms`` the cursor must carry an expiry that has not passed.
        """
        try:
            doc = json.loads(self._sealer.unseal(token))
        except (SealError, ValueError):
            doc = None
        if not isinstance(doc, dict) or type(doc.get("s")) is not int or type(doc.get("o")) is not int:
            raise KipError("CursorInvalid", "the cursor is not one this runtime issued",
                           details={"family": family.lower(), "reason": "malformed"})
        if doc.get("f") != family:
            raise KipError("CursorTypeMismatch", f"the cursor continues a {doc.get('f')} traversal, not {family}",
                           details={"family": family.lower()})
        if doc.get("b") != _digest(binding):
            raise KipError("CursorMismatch", "the cursor belongs to a different command or parameters",
                           details={"family": family.lower()})
        if now_ms is not None:
            expires = doc.get("x")
            if type(expires) is not int:
                raise KipError("CursorTypeMismatch", f"the cursor is not a {family} continuation",
                               details={"family": family.lower()})
            if now_ms > expires:
                raise KipError("CursorExpired", f"the {family} cursor has expired; restart the query",
                               details={"family": family.lower(), "reason": "expired"})
        if doc["s"] < 0 or doc["o"] < 0:  # pragma: no cover - only our own sealed tokens get here
            raise KipError("CursorInvalid", "corrupt cursor position",
                           details={"family": family.lower(), "reason": "malformed"})
        return doc["s"], doc["o"]


def _digest(binding: object) -> str:
    return hashlib.sha256(json.dumps(binding, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()[:32]
