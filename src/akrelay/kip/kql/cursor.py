"""KQL continuation cursors (§44.8, §87.7, §88.4): the runtime's cursor codec with an expiry.

The token is the runtime's (``akrelay.kip.paging``), family ``KQL``; it binds a
digest of the query (its AST without the CURSOR clause: whitespace and comments
do not matter, any other change does), the bound parameters other than the
cursor itself, and the Space, and pins the snapshot ``seq`` the first page read.
Errors are reported as KQL errors with ``family: kql``.
"""

from __future__ import annotations

from akrelay.kip import paging
from akrelay.kip.errors import KipError
from akrelay.kip.kql.errors import KqlError

FAMILY = "KQL"
#: How long a KQL cursor stays valid after it is issued.
TTL_MS = 15 * 60 * 1000


def encode(codec: paging.CursorCodec, binding: object, seq: int, offset: int, expires_at_ms: int) -> str:
    return codec.encode(FAMILY, binding, seq, offset, expires_at_ms=expires_at_ms)


def decode(codec: paging.CursorCodec, token: object, binding: object, now_ms: int) -> tuple[int, int]:
    """``(seq, offset)``; malformed/forged -> CursorInvalid, other family -> CursorTypeMismatch,
    other query/parameters/Space -> CursorMismatch, past its expiry -> CursorExpired."""
    if not isinstance(token, str) or not token:
        raise KqlError("CursorInvalid", "CURSOR must be a non-empty string",
                       details={"family": "kql", "reason": "malformed"})
    try:
        return codec.decode(token, FAMILY, binding, now_ms=now_ms)
    except KipError as exc:
        raise KqlError(exc.code, exc.message, details={**(exc.details or {}), "family": "kql"}) from None
