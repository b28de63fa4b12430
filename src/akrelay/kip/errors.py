"""KIP errors (§86 shape, §87 codes).

The gateway has its own error type because KIP errors carry a category and a retry
class that agent-knowledge errors do not; mapping happens once, here.
"""

from __future__ import annotations

from typing import Mapping

from akrelay.jsontypes import JSONValue

#: §87 code -> (§86.2 category, §86.3 retry class).
CODES: dict[str, tuple[str, str]] = {
    "InvalidSyntax": ("syntax", "requires_different_input"),
    "InvalidIdentifier": ("syntax", "requires_different_input"),
    "InvalidRequestEnvelope": ("protocol", "requires_different_input"),
    "UnsupportedProtocolVersion": ("protocol", "requires_different_input"),
    "UnsupportedCapability": ("protocol", "requires_different_input"),
    "UnsupportedIsolation": ("protocol", "requires_different_input"),
    "LanguageMismatch": ("protocol", "requires_different_input"),
    "ReadonlyViolation": ("protocol", "requires_different_input"),
    "SchemaSymbolNotFound": ("schema", "requires_different_input"),
    "SchemaSymbolAmbiguous": ("schema", "requires_different_input"),
    "TypeMismatch": ("schema", "requires_different_input"),
    "ConstraintViolation": ("schema", "requires_different_input"),
    "NotFoundOrNotVisible": ("data", "requires_different_input"),
    "ReferenceError": ("data", "requires_different_input"),
    "ProjectionPolicyUnavailable": ("epistemic", "requires_different_input"),
    "PreconditionFailed": ("transaction", "requires_refresh"),
    "HistoricalSnapshotUnavailable": ("history", "requires_new_snapshot"),
    "CursorMismatch": ("history", "requires_different_input"),
    "CursorInvalid": ("history", "requires_different_input"),
    "CursorTypeMismatch": ("history", "requires_different_input"),
    "CursorExpired": ("history", "requires_refresh"),
    "ProjectionTargetUnbound": ("epistemic", "requires_different_input"),
    "ProjectionTargetUnbounded": ("epistemic", "requires_different_input"),
    "SearchModeUnsupported": ("search", "requires_different_input"),
    "SearchIndexUnavailable": ("search", "safe_same_request"),
    "HistoricalSearchUnavailable": ("search", "requires_different_input"),
    "ResultLimitExceeded": ("resource", "requires_different_input"),
    # Every resource this runtime refuses is a fixed limit (nesting, request depth,
    # solutions, path hops, REGEX sizes), never load: the same request fails again.
    "ResourceExhausted": ("resource", "requires_different_input"),
    # CPU budget spent (akrelay.kip.budget): thread CPU time does not depend on
    # load, so the same request would spend it again.
    "ExecutionTimeout": ("resource", "requires_different_input"),
    "InternalError": ("system", "non_retryable"),
}


class KipError(Exception):
    """A KIP runtime error with a §87 code; ``to_wire`` gives the §86.1 object."""

    __slots__ = ("code", "message", "details", "hint")

    def __init__(self, code: str, message: str, *, details: Mapping[str, JSONValue] | None = None,
                 hint: str | None = None) -> None:
        if code not in CODES:
            raise ValueError(f"unregistered KIP error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details: dict[str, JSONValue] | None = dict(details) if details is not None else None
        self.hint = hint

    @property
    def category(self) -> str:
        return CODES[self.code][0]

    def to_wire(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "code": self.code,
            "category": self.category,
            "message": self.message,
            "retry": {"class": CODES[self.code][1]},
        }
        if self.hint:
            body["hint"] = self.hint
        if self.details is not None:
            body["details"] = self.details
        return body
