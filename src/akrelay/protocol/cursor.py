"""Stateless, authenticated query cursors (Agent Knowledge §9.3.2).

:class:`Sealer` is the one mechanism behind every cursor akrelay issues (the
relay's query cursors here, the KIP runtime's LIST/SEARCH/KQL cursors in
``akrelay.kip.paging``): an opaque URL-safe token holding a body and its
HMAC-SHA256 tag over the body and whatever the token is bound to.

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
from typing import Mapping

from akrelay.protocol.errors import ProtocolError

_VERSION = 1
_LAYOUT = struct.Struct(">BQQQ")  # version, checkpoint, as_of, last_seq
_TAG_BYTES = 16
_MAX_SAFE = 2**53 - 1


class SealError(ValueError):
    """A token that is not one this sealer issued: ``reason`` is ``malformed`` or ``forged``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Sealer:
    """Seal bytes into an opaque token and open it again, under one secret.

    ``context`` separates the key of one token family from another's under the
    same secret (the empty context uses the secret itself).
    """

    __slots__ = ("_key",)

    def __init__(self, secret: bytes, context: bytes = b"") -> None:
        self._key = hmac.new(bytes(secret), context, hashlib.sha256).digest() if context else bytes(secret)

    def _tag(self, body: bytes, bound: bytes) -> bytes:
        return hmac.new(self._key, body + bound, hashlib.sha256).digest()[:_TAG_BYTES]

    def seal(self, body: bytes, bound: bytes = b"") -> str:
        return base64.urlsafe_b64encode(body + self._tag(body, bound)).rstrip(b"=").decode("ascii")

    def unseal(self, token: object, bound: bytes = b"", *, body_size: int | None = None, max_chars: int = 4096) -> bytes:
        """The body of a token sealed here for ``bound``, else :class:`SealError`.

        Only the canonical (unpadded) encoding is accepted; ``body_size`` fixes
        the body's length where the format has one.
        """
        if type(token) is not str or not token.isascii() or len(token) > max_chars:
            raise SealError("malformed")
        if body_size is not None and len(token) != ((body_size + _TAG_BYTES) * 4 + 2) // 3:
            raise SealError("malformed")
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            raise SealError("malformed") from None
        if len(raw) <= _TAG_BYTES or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != token:
            raise SealError("malformed")
        body, tag = raw[:-_TAG_BYTES], raw[-_TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(body, bound)):
            raise SealError("forged")
        return body


@dataclass(frozen=True, slots=True)
class CursorState:
    checkpoint: int
    as_of: int
    last_seq: int


def binding_digest(binding: Mapping[str, object]) -> bytes:
    """SHA-256 over a canonical serialization of the request binding (order-independent)."""
    text = json.dumps(dict(binding), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).digest()


def _invalid(message: str) -> ProtocolError:
    return ProtocolError("invalid_cursor", message)


class CursorCodec:
    """Encode and decode the relay's query cursors under one service secret (at least 16 bytes)."""

    __slots__ = ("_sealer",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
            raise ValueError("cursor secret must be at least 16 bytes")
        self._sealer = Sealer(secret)

    def encode(self, binding: Mapping[str, object], state: CursorState) -> str:
        for name in ("checkpoint", "as_of", "last_seq"):
            value = getattr(state, name)
            if type(value) is not int or not 0 <= value <= _MAX_SAFE:
                raise ValueError(f"{name} must be a non-negative safe integer")
        body = _LAYOUT.pack(_VERSION, state.checkpoint, state.as_of, state.last_seq)
        return self._sealer.seal(body, binding_digest(binding))

    def decode(
        self,
        token: object,
        binding: Mapping[str, object],
        *,
        current_checkpoint: int | None = None,
        now_ms: int | None = None,
        max_age_ms: int | None = None,
    ) -> CursorState:
        """The state of a cursor issued for exactly ``binding``, or ``invalid_cursor``.

        ``current_checkpoint`` rejects a cursor from a different (reset) service
        state; ``now_ms`` with ``max_age_ms`` expires old cursors.
        """
        try:
            body = self._sealer.unseal(token, binding_digest(binding), body_size=_LAYOUT.size)
        except SealError as exc:
            if exc.reason == "malformed":
                raise _invalid("malformed cursor") from None
            raise _invalid("cursor was not issued here for these query parameters") from None
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
