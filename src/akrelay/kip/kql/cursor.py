"""KQL continuation cursors (§44.8, §87.7, §88.4).

The token has the same shape and MAC key as the runtime's LIST/SEARCH cursors
(``akrelay.kip.paging``), so a cursor from one family is recognised — and
refused with ``CursorTypeMismatch`` — by every other. A KQL cursor additionally
carries an expiry; it binds a digest of the query (its AST without the CURSOR
clause: whitespace and comments do not matter, any other change does), the
bound parameters other than the cursor itself, and the Space, and pins the
snapshot ``seq`` the first page read.
"""

from __future__ import annotations

import json
from typing import Any

from akrelay.kip import paging
from akrelay.kip.errors import KipError
from akrelay.kip.kql.errors import KqlError

FAMILY = "KQL"
#: How long a KQL cursor stays valid after it is issued.
TTL_MS = 15 * 60 * 1000


def encode(codec: paging.CursorCodec, binding: Any, seq: int, offset: int, expires_at_ms: int) -> str:
    body = json.dumps({"f": FAMILY, "b": paging._digest(binding), "s": seq, "o": offset, "x": expires_at_ms},
                      separators=(",", ":")).encode()
    return paging._b64(body) + "." + paging._b64(codec._mac(body))


def decode(codec: paging.CursorCodec, token: str, binding: Any, now_ms: int) -> tuple[int, int]:
    """``(seq, offset)``; malformed/forged -> CursorInvalid, other family -> CursorTypeMismatch,
    other query/parameters/Space -> CursorMismatch, past its expiry -> CursorExpired."""
    if not isinstance(token, str) or not token:
        raise KqlError("CursorInvalid", "CURSOR must be a non-empty string",
                       details={"family": "kql", "reason": "malformed"})
    try:
        seq, offset = codec.decode(token, FAMILY, binding)
    except KipError as exc:
        details = dict(exc.details or {})
        details["family"] = "kql"
        if exc.code == "CursorInvalid":
            details["reason"] = "malformed"
        raise KqlError(exc.code, exc.message, details=details) from None
    doc = json.loads(paging._unb64(token.split(".")[0]))
    expires = doc.get("x")
    if not isinstance(expires, int):
        raise KqlError("CursorTypeMismatch", "the cursor is not a KQL continuation", details={"family": "kql"})
    if now_ms > expires:
        raise KqlError("CursorExpired", "the KQL cursor has expired; restart the query",
                       details={"family": "kql", "reason": "expired"})
    if offset < 0 or seq < 0:  # pragma: no cover - only our own MAC'd tokens get here
        raise KqlError("CursorInvalid", "corrupt cursor position", details={"family": "kql", "reason": "malformed"})
    return seq, offset
