"""Signing for clients and tests (Agent Identity §5–6.2).

The relay itself never signs; this exists so that clients, tools and tests
produce envelopes through the same JCS and hash code the verifier uses.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from akrelay.protocol.agent_id import agent_id_from_public_key
from akrelay.protocol.b64 import b64encode
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.jcs import canonicalize

PROTOCOL = "agent-knowledge/1.0"
MAX_SAFE_INTEGER = 2**53 - 1
#: Identity §6.2: one Max-Seen-Nonce header may move the next nonce at most this far.
MAX_NONCE_JUMP = 2**32


class Signer:
    """An Ed25519 key that signs events as ``did:agent:<public key>``."""

    __slots__ = ("_private", "seed", "public_key", "agent_id")

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError("an Ed25519 seed is exactly 32 bytes")
        self.seed = bytes(seed)
        self._private = Ed25519PrivateKey.from_private_bytes(self.seed)
        self.public_key = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.agent_id = agent_id_from_public_key(self.public_key)

    @classmethod
    def from_seed(cls, seed: bytes) -> Signer:
        return cls(seed)

    @classmethod
    def generate(cls, random_bytes: Callable[[int], bytes]) -> Signer:
        """A new identity from 32 bytes of ``random_bytes`` (e.g. ``secrets.token_bytes``): the core has no RNG."""
        return cls(random_bytes(32))

    def sign_hash(self, event_hash: bytes) -> str:
        """Signature text over raw 32 hash bytes. Prefer :meth:`sign`, which sees the event (§5.3)."""
        return b64encode(self._private.sign(event_hash))

    def sign(self, event: Mapping[str, object]) -> dict[str, object]:
        """The signed envelope ``{hash, event, signature}`` of ``event``."""
        digest = hashlib.sha3_256(canonicalize(event)).digest()
        return {"hash": b64encode(digest), "event": event, "signature": self.sign_hash(digest)}

    def __repr__(self) -> str:
        return f"Signer({self.agent_id})"


def _event(event_type: str, actor: str, created_at: int, nonce: int, payload: Mapping[str, object]) -> dict[str, object]:
    return {
        "protocol": PROTOCOL,
        "type": event_type,
        "actor": actor,
        "created_at": created_at,
        "nonce": nonce,
        "payload": payload,
    }


def publish_event(actor: str, created_at: int, nonce: int, payload: Mapping[str, object]) -> dict[str, object]:
    """An unsigned ``knowledge.publish`` event."""
    return _event("knowledge.publish", actor, created_at, nonce, payload)


def assess_event(actor: str, created_at: int, nonce: int, payload: Mapping[str, object]) -> dict[str, object]:
    """An unsigned ``knowledge.assess`` event."""
    return _event("knowledge.assess", actor, created_at, nonce, payload)


def retract_event(actor: str, created_at: int, nonce: int, payload: Mapping[str, object]) -> dict[str, object]:
    """An unsigned ``knowledge.retract`` event."""
    return _event("knowledge.retract", actor, created_at, nonce, payload)


class NonceClock:
    """Clock-derived nonces, ``nonce = max(last + 1, created_at)`` (Identity §6.2).

    Monotonic across restarts and devices sharing a key without coordination;
    without a clock value it simply counts.
    """

    __slots__ = ("next_nonce",)

    def __init__(self, next_nonce: int = 1) -> None:
        if type(next_nonce) is not int or not 1 <= next_nonce <= MAX_SAFE_INTEGER:
            raise ValueError("next_nonce must be an integer in 1..2^53-1")
        self.next_nonce = next_nonce

    def peek(self) -> int:
        return self.next_nonce

    def next(self, created_at: int | None = None) -> int:
        """Allocate the nonce for an event created at ``created_at`` (Unix ms)."""
        nonce = self.next_nonce if created_at is None else max(self.next_nonce, created_at)
        if nonce > MAX_SAFE_INTEGER:
            raise ProtocolError("invalid_event", "the nonce sequence is exhausted (2^53-1)")
        self.next_nonce = nonce + 1
        return nonce

    def observe_max_seen_nonce(self, header: str, now_ms: int) -> int:
        """Apply a service's ``Max-Seen-Nonce`` header, bounded as Identity §6.2 requires.

        A header at or above the next nonce advances it to ``header + 1``; a
        header that would move it more than 2^32 beyond ``max(next_nonce,
        now_ms)`` is refused (one hostile service must not exhaust the sequence
        every service shares) and nothing changes. Returns the next nonce.
        """
        if type(header) is not str or not header.isascii() or not header.isdigit() or len(header) > 16:
            raise ProtocolError("invalid_response", f"Max-Seen-Nonce must be a decimal integer, got {header!r}")
        value = int(header)
        if value > MAX_SAFE_INTEGER:
            raise ProtocolError("invalid_response", "Max-Seen-Nonce is outside the safe nonce range")
        bound = max(self.next_nonce, now_ms) + MAX_NONCE_JUMP
        if value > bound:
            raise ProtocolError(
                "invalid_response",
                f"Max-Seen-Nonce {value} jumps too far: more than 2^32 beyond {max(self.next_nonce, now_ms)}",
                {"max_seen_nonce": value, "bound": bound},
            )
        if value >= self.next_nonce:
            self.next_nonce = value + 1
        return self.next_nonce
