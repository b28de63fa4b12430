"""Recommended limits (Agent Knowledge §9.7) as configurable service limits.

These are local admission policy, not validity: a valid envelope over a limit
is refused with ``payload_too_large`` and stays valid elsewhere. ``data`` names
the limit so that a client can see which one it hit.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from akrelay.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from akrelay.protocol.envelope import Envelope


@dataclass(frozen=True, slots=True)
class Limits:
    max_envelope_bytes: int = 262_144
    max_title_chars: int = 256
    max_statement_chars: int = 16_384
    max_basis_chars: int = 16_384
    max_evidence: int = 64
    max_relations: int = 64
    max_tags: int = 32
    max_steps: int = 64
    max_profiles: int = 16
    max_extra_bytes: int = 16_384

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer")

    def to_discovery(self) -> dict[str, int]:
        """The ``limits`` member of a discovery document (§9.2)."""
        return asdict(self)


DEFAULT_LIMITS = Limits()


def _too_large(limit: str, maximum: int, actual: int, what: str) -> ProtocolError:
    return ProtocolError(
        "payload_too_large",
        f"{what} is {actual}, over the service limit {limit}={maximum}",
        {"limit": limit, "max": maximum, "actual": actual},
    )


def _extra_bytes(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8"))


_TEXT_LIMITS: tuple[tuple[Literal["title", "statement", "basis"], str], ...] = (
    ("title", "max_title_chars"), ("statement", "max_statement_chars"), ("basis", "max_basis_chars"))
_ARRAY_LIMITS: tuple[tuple[Literal["evidence", "relations", "tags", "profiles"], str], ...] = (
    ("evidence", "max_evidence"), ("relations", "max_relations"), ("tags", "max_tags"), ("profiles", "max_profiles"))


def check_limits(envelope: Envelope, limits: Limits = DEFAULT_LIMITS, *, envelope_bytes: int | None = None) -> None:
    """Raise ``payload_too_large`` if ``envelope`` exceeds a service limit.

    ``envelope_bytes`` is the size of the submitted UTF-8 bytes when known;
    otherwise the canonical serialization is measured.
    """
    size = envelope_bytes if envelope_bytes is not None else len(envelope.canonical_bytes())
    if size > limits.max_envelope_bytes:
        raise _too_large("max_envelope_bytes", limits.max_envelope_bytes, size, "envelope size in bytes")
    payload = envelope.event["payload"]
    for field, limit in _TEXT_LIMITS:
        if field in payload:
            maximum = getattr(limits, limit)
            n = len(payload[field])  # str length counts Unicode scalar values
            if n > maximum:
                raise _too_large(limit, maximum, n, f"{field} length in Unicode scalar values")
    for array, limit in _ARRAY_LIMITS:
        if array in payload:
            maximum = getattr(limits, limit)
            n = len(payload[array])
            if n > maximum:
                raise _too_large(limit, maximum, n, f"number of {array}")
    reproduction = payload.get("reproduction")
    if reproduction is not None and len(reproduction["steps"]) > limits.max_steps:
        raise _too_large("max_steps", limits.max_steps, len(reproduction["steps"]), "number of reproduction steps")
    if "extra" in payload:
        try:
            n = _extra_bytes(payload["extra"])
        except RecursionError:
            raise ProtocolError(
                "payload_too_large", "extra is nested too deeply to serialize within the service limits",
                {"limit": "max_extra_bytes", "max": limits.max_extra_bytes},
            ) from None
        if n > limits.max_extra_bytes:
            raise _too_large("max_extra_bytes", limits.max_extra_bytes, n, "serialized extra size in bytes")
