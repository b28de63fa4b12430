"""Signed envelopes (Agent Identity §5, Agent Knowledge §8.1 step 1).

An :class:`Envelope` exists only after verification, so holding one means the
strict parse, the closed shape, the hash and the signature have all passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Envelope:
    """A verified agent-knowledge envelope. Treat ``event`` as read-only."""

    id: str
    event: dict[str, Any]
    signature: str
    event_jcs: bytes

    @property
    def type(self) -> str:
        return self.event["type"]

    @property
    def actor(self) -> str:
        return self.event["actor"]

    @property
    def created_at(self) -> int:
        return self.event["created_at"]

    @property
    def nonce(self) -> int:
        return self.event["nonce"]

    @property
    def payload(self) -> dict[str, Any]:
        return self.event["payload"]

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.id, "event": self.event, "signature": self.signature}

    def canonical_bytes(self) -> bytes:
        """JCS of the whole envelope: keys sort as ``event``, ``hash``, ``signature``."""
        return b'{"event":' + self.event_jcs + b',"hash":"' + self.id.encode() + b'","signature":"' + self.signature.encode() + b'"}'
