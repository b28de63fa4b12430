"""KnowQL transport errors: one exception, mapped to the wire in :mod:`akrelay.http.knowql`."""

from __future__ import annotations

from akrelay.jsontypes import JSON


class KnowqlError(Exception):
    """A refused request: HTTP ``status`` with the seed 000 §9.4 body ``{"error": {"code", "message"}}``.

    ``extra`` members join ``code`` and ``message`` inside ``error`` (a timed-out
    turn names its ``query_id`` and ``session_id``).
    """

    def __init__(self, status: int, code: str, message: str, **extra: JSON) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra
        #: response headers the refusal adds (``Retry-After`` on a 429 or 503)
        self.headers: dict[str, str] = {}

    def to_wire(self) -> dict[str, JSON]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


def bad_request(message: str, code: str = "bad_request") -> KnowqlError:
    return KnowqlError(400, code, message)


def not_found(code: str, message: str) -> KnowqlError:
    return KnowqlError(404, code, message)


def conflict(code: str, message: str) -> KnowqlError:
    return KnowqlError(409, code, message)
