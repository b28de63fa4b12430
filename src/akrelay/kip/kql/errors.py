"""The KIP error raised by the KQL/META front end and evaluator.

It carries the stable KIP §87 code plus the §86.1 shape (category, hint, retry
class, details), so the runtime maps it to the response envelope in one place
and never has to guess a code from a Python exception type.
"""

from __future__ import annotations

from typing import Mapping

from akrelay.jsontypes import JSONValue

from akrelay.kip.errors import CODES as _KIP_CODES
from akrelay.kip.errors import KipError

#: §86.2 category of each code this package raises.
CATEGORY: dict[str, str] = {
    "InvalidSyntax": "syntax",
    "ReadonlyViolation": "protocol",
    "UnsupportedCapability": "protocol",
    "LanguageMismatch": "protocol",
    "SchemaSymbolNotFound": "schema",
    "SchemaSymbolAmbiguous": "schema",
    "TypeMismatch": "schema",
    "ConstraintViolation": "schema",
    "ReferenceError": "data",
    "NotFoundOrNotVisible": "data",
    "ProjectionTargetUnbound": "epistemic",
    "ProjectionTargetUnbounded": "epistemic",
    "ProjectionPolicyUnavailable": "epistemic",
    "HistoricalSnapshotUnavailable": "history",
    "CursorMismatch": "history",
    "CursorTypeMismatch": "history",
    "CursorExpired": "history",
    "CursorInvalid": "history",
    "SearchModeUnsupported": "search",
    "SearchIndexUnavailable": "search",
    "HistoricalSearchUnavailable": "search",
    "ResourceExhausted": "resource",
    "ResultLimitExceeded": "resource",
    "InternalError": "system",
}

#: §86.3 retry class of each code (default: requires_different_input).
RETRY: dict[str, str] = {
    "CursorExpired": "requires_refresh",
    "HistoricalSnapshotUnavailable": "requires_new_snapshot",
    "SearchIndexUnavailable": "safe_same_request",
    "ResourceExhausted": "requires_different_input",
    "InternalError": "non_retryable",
}


class KqlError(KipError):
    """A KIP error: ``code`` from §87, a human ``message``, an optional ``hint``.

    It is a :class:`akrelay.kip.errors.KipError`, so the runtime's single error
    mapping covers the language layer too; it also admits the cursor, projection
    and search codes the language layer needs beyond that module's registry.

    ``details`` holds machine-readable context such as ``line``/``column`` of a
    syntax error or ``family``/``reason`` of a cursor error (§87.7).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        hint: str | None = None,
        details: Mapping[str, JSONValue] | None = None,
    ) -> None:
        Exception.__init__(self, f"{code}: {message}")
        self.code = code
        self.message = message
        self.hint = hint
        self.details: dict[str, JSONValue] = dict(details or {})

    @property
    def category(self) -> str:
        if self.code in CATEGORY:
            return CATEGORY[self.code]
        return _KIP_CODES.get(self.code, ("protocol", ""))[0]

    @property
    def retry(self) -> str:
        if self.code in RETRY:
            return RETRY[self.code]
        return _KIP_CODES.get(self.code, ("", "requires_different_input"))[1]

    @property
    def line(self) -> int | None:
        return _position(self.details.get("line"))

    @property
    def column(self) -> int | None:
        return _position(self.details.get("column"))

    def to_wire(self) -> dict[str, JSONValue]:
        """The §86.1 error object."""
        body: dict[str, JSONValue] = {
            "code": self.code,
            "category": self.category,
            "message": self.message,
            "retry": {"class": self.retry},
            "details": dict(self.details),
        }
        if self.hint:
            body["hint"] = self.hint
        return body

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"KqlError({self.code!r}, {self.message!r}, details={self.details!r})"


def _position(value: JSONValue | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def syntax_error(message: str, *, line: int | None = None, column: int | None = None,
                 hint: str | None = None) -> KqlError:
    """An ``InvalidSyntax`` error positioned at ``line``/``column`` (1-based)."""
    details: dict[str, JSONValue] = {}
    if line is not None:
        details["line"] = line
    if column is not None:
        details["column"] = column
    return KqlError("InvalidSyntax", message, hint=hint, details=details)
