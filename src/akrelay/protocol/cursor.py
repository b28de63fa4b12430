"""Stateless, authenticated query cursors (Agent Knowledge §9.3.2).

A cursor carries the page's frozen scope (checkpoint, ``as_of``) and the last
returned ``seq``, and is bound to a digest of the normalized request, all under
an HMAC-SHA256 tag. A service keeps no read state between pages, yet a forged,
truncated, edited or reused-with-other-parameters cursor fails with
``invalid_cursor`` instead of silently restarting.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from akrelay.protocol.errors import ProtocolError

_VERSION = 1
_LAYOUT = struct.Struct(">BQQQ")  # version, checkpoint, as_of, last_seq
_TAG_BYTES = 16
_TOKEN_BYTES = _LAYOUT.size + _TAG_BYTES
_MAX_SAFE = 2**53 - 1


@dataclass(frozen=True, slots=True)
class CursorState:
    checkpoint: int
    as_of: int
    last_seq: int


def binding_digest(binding: Mapping[str, Any]) -> bytes:
    """SHA-256 over a canonical serialization of the request binding (order-independent)."""
    text = json.dumps(dict(binding), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).digest()


def _invalid(message: str) -> ProtocolError:
    return ProtocolError("invalid_cursor", message)


class CursorCodec:
    """Encode and decode cursors under one service secret (at least 16 bytes)."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
            raise ValueError("cursor secret must be at least 16 bytes")
        self._key = bytes(secret)

    def _tag(self, body: bytes, binding: Mapping[str, Any]) -> bytes:
        return hmac.new(self._key, body + binding_digest(binding), hashlib.sha256).digest()[:_TAG_BYTES]

    def encode(self, binding: Mapping[str, Any], state: CursorState) -> str:
        for name in ("checkpoint", "as_of", "last_seq"):
            value = getattr(state, name)
            if type(value) is not int or not 0 <= value <= _MAX_SAFE:
                raise ValueError(f"{name} must be a non-negative safe integer")
        body = _LAYOUT.pack(_VERSION, state.checkpoint, state.as_of, state.last_seq)
        return base64.urlsafe_b64encode(body + self._tag(body, binding)).rstrip(b"=").decode("ascii")

    def decode(
        self,
        token: Any,
        binding: Mapping[str, Any],
        *,
        current_checkpoint: int | None = None,
        now_ms: int | None = None,
        max_age_ms: int | None = None,
    ) -> CursorState:
        """The state of a cursor issued for exactly ``binding``, or ``invalid_cursor``.

        ``current_checkpoint`` rejects a cursor from a different (reset) service
        state; ``now_ms`` with ``max_age_ms`` expires old cursors.
        """
        if type(token) is not str or not token.isascii() or len(token) != (_TOKEN_BYTES * 4 + 2) // 3:
            raise _invalid("malformed cursor")
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            raise _invalid("malformed cursor") from None
        if len(raw) != _TOKEN_BYTES or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != token:
            raise _invalid("malformed cursor")
        body, tag = raw[: _LAYOUT.size], raw[_LAYOUT.size:]
        if not hmac.compare_digest(tag, self._tag(body, binding)):
            raise _invalid("cursor was not issued here for these query parameters")
        version, checkpoint, as_of, last_seq = _LAYOUT.unpack(body)
        state = CursorState(checkpoint, as_of, last_seq)
        after_seq = binding.get("after_seq", 0)
        if version != _VERSION or not after_seq <= last_seq <= checkpoint:
            raise _invalid("cursor does not belong to this request")
        if current_checkpoint is not None and checkpoint > current_checkpoint:
            raise _invalid("cursor does not belong to this service state")
        if now_ms is not None and max_age_ms is not None and now_ms - as_of > max_age_ms:
            raise _invalid("cursor expired; restart the query")
        return state
