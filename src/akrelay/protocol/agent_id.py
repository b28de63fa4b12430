"""Agent IDs: ``did:agent:`` + canonical base64url of a raw Ed25519 key (Identity §3.2–3.3)."""

from __future__ import annotations

from akrelay.protocol.b64 import b64decode_canonical, b64encode
from akrelay.protocol.errors import ProtocolError

PREFIX = "did:agent:"
_PREFIX_LEN = len(PREFIX)
AGENT_ID_LENGTH = _PREFIX_LEN + 43


def agent_id_from_public_key(public_key: bytes) -> str:
    """The canonical Agent ID of a raw 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise ValueError("an Ed25519 public key is exactly 32 bytes")
    return PREFIX + b64encode(bytes(public_key))


def public_key_from_agent_id(agent_id: object, code: str = "invalid_event", what: str = "actor") -> bytes:
    """Decode an Agent ID (§3.3 steps 1–5), raising ``ProtocolError(code)`` if malformed."""
    if type(agent_id) is not str:
        raise ProtocolError(code, f"{what} must be an Agent ID string")
    if not agent_id.startswith(PREFIX):
        raise ProtocolError(code, f"{what} must start with {PREFIX!r}")
    return b64decode_canonical(agent_id[_PREFIX_LEN:], length=32, code=code, what=f"{what} public key")


def is_agent_id(value: object) -> bool:
    """True when ``value`` is a canonical Agent ID."""
    try:
        public_key_from_agent_id(value)
    except ProtocolError:
        return False
    return True
