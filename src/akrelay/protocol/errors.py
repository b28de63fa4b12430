"""The one error type of the protocol core.

Every rejection the core can produce is a :class:`ProtocolError` carrying the
specification's stable code, so that the HTTP layer, the sync loop and the CLI
map it to the wire in one place instead of guessing from exception types.
"""

from __future__ import annotations

from typing import Mapping

#: Recommended HTTP status for each code (Identity §8.1, Knowledge §9.7).
HTTP_STATUS: dict[str, int] = {
    "invalid_request": 400,
    "invalid_event": 400,
    "invalid_event_hash": 400,
    "invalid_signature": 400,
    "invalid_actor": 400,
    "timestamp_out_of_window": 400,
    "nonce_not_greater": 409,
    "invalid_token": 401,
    "permission_denied": 403,
    "not_found": 404,
    "rate_limited": 429,
    "payload_too_large": 413,
    "missing_dependency": 409,
    "invalid_target": 400,
    "invalid_cursor": 400,
    "query_too_broad": 422,
    "query_unavailable": 503,
    # local extension (docs/api.md): the shared store is unreachable; retry after Retry-After
    "service_unavailable": 503,
    "unsupported_search_mode": 400,
    # local extensions (docs/transparency.md): a witness's add-checkpoint (C2SP tlog-witness)
    "checkpoint_conflict": 409,
    "inconsistent_checkpoint": 422,
}


class ProtocolError(Exception):
    """A rejection with the spec's ``code``, a human ``message`` and optional ``data``."""

    __slots__ = ("code", "message", "data")

    def __init__(self, code: str, message: str, data: Mapping[str, object] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 400)

    def to_wire(self) -> dict[str, dict[str, object]]:
        """The Identity §8.1 error body."""
        body: dict[str, object] = {"code": self.code, "message": self.message}
        if self.data is not None:
            body["data"] = self.data
        return {"error": body}

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"ProtocolError({self.code!r}, {self.message!r}, {self.data!r})"
