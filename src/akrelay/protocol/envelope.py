"""Signed envelopes (Agent Identity §5–6.1, Agent Knowledge §8.1 step 1).

An :class:`Envelope` exists only after verification, so holding one means the
strict parse, the closed shape, the hash and the signature have all passed.
Cheap shape checks run before hashing and the signature, so garbage costs
little (Identity §6.1 allows that ordering).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Mapping, cast

import msgspec

from akrelay.jsontypes import JSON
from akrelay.protocol.agent_id import PREFIX as AGENT_ID_PREFIX
from akrelay.protocol.agent_id import public_key_from_agent_id
from akrelay.protocol.b64 import b64decode_canonical, b64encode
from akrelay.protocol.documents import EnvelopeObject, Event, Payload
from akrelay.protocol.ed25519 import verify_strict
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import parse_strict_for_jcs
from akrelay.protocol.jcs import JCSError, canonicalize, dumps_sorted
from akrelay.protocol.options import DEFAULT_OPTIONS, ValidationOptions

PROTOCOL = "agent-knowledge/1.0"
EVENT_TYPES = frozenset(("knowledge.publish", "knowledge.assess", "knowledge.retract"))
MAX_SAFE_INTEGER = 2**53 - 1
#: The six Agent Identity event fields (§5.1).
IDENTITY_EVENT_FIELDS = ("protocol", "type", "actor", "created_at", "nonce", "payload")
_EVENT_KEYS = frozenset(IDENTITY_EVENT_FIELDS)
_ENVELOPE_FIELDS = ("hash", "event", "signature")
_ENVELOPE_KEYS = frozenset(_ENVELOPE_FIELDS)

_HASH_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")
_SIGNATURE_SHAPE = re.compile(r"[A-Za-z0-9_-]{86}")
# The schema's agentId pattern. Canonicality (zero trailing bits) is checked
# when the actor is decoded into a key, Identity §6.1 step 4, after the hash.
_AGENT_ID_SHAPE = re.compile(r"did:agent:[A-Za-z0-9_-]{43}")

# Layout of Envelope.canonical_bytes(): the event JCS, then fixed-width hash and signature.
_HEAD = b'{"event":'
_TAIL = len(b',"hash":"') + 43 + len(b'","signature":"') + 86 + len(b'"}')
_TRUSTED_DECODER = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class Envelope:
    """A verified agent-knowledge envelope. Treat ``event`` as read-only."""

    id: str
    event: Event
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
    def payload(self) -> Payload:
        return self.event["payload"]

    def to_dict(self) -> EnvelopeObject:
        """The envelope as a JSON object (Identity §5.2); the event is the verified one, not a copy."""
        return {"hash": self.id, "event": self.event, "signature": self.signature}

    def canonical_bytes(self) -> bytes:
        """JCS of the whole envelope: keys sort as ``event``, ``hash``, ``signature``."""
        return (b'{"event":' + self.event_jcs + b',"hash":"' + self.id.encode()
                + b'","signature":"' + self.signature.encode() + b'"}')

    @classmethod
    def from_trusted(cls, canonical_bytes: bytes) -> Envelope:
        """Rebuild an envelope from :meth:`canonical_bytes` written after verification.

        No re-verification: only stores that wrote these bytes themselves may
        call this. Raises ``ValueError`` if the bytes do not have that layout.
        """
        data = bytes(canonical_bytes)
        if (
            len(data) < len(_HEAD) + 2 + _TAIL
            or not data.startswith(_HEAD)
            or data[-_TAIL : -_TAIL + 9] != b',"hash":"'
            or data[-103:-88] != b'","signature":"'
            or not data.endswith(b'"}')
        ):
            raise ValueError("not the canonical bytes of a verified envelope")
        event_jcs = data[len(_HEAD) : -_TAIL]
        event: Event = _TRUSTED_DECODER.decode(event_jcs)
        if type(event) is not dict:
            raise ValueError("not the canonical bytes of a verified envelope")
        return cls(data[-146:-103].decode("ascii"), event, data[-88:-2].decode("ascii"), event_jcs)


def event_hash(event: object) -> str:
    """The event ID: base64url(SHA3-256(JCS(event))) (Identity §5.2); ``JCSError`` if ``event`` is not JSON."""
    return b64encode(hashlib.sha3_256(canonicalize(event)).digest())


def _fail(message: str) -> ProtocolError:
    return ProtocolError("invalid_event", message)


def _closed(obj: Mapping[str, object], fields: tuple[str, ...], allowed: frozenset[str], where: str) -> None:
    for name in fields:
        if name not in obj:
            raise _fail(f"{where} is missing required field {name!r}")
    for name in obj:
        if name not in allowed:
            raise _fail(f"{where} has unknown field {name!r}")


def _check_integer(value: object, low: int, name: str) -> None:
    # bool is a subclass of int in Python but not a JSON number.
    if type(value) is not int:
        raise _fail(f"event.{name} must be a JSON integer")
    if not low <= value <= MAX_SAFE_INTEGER:
        raise _fail(f"event.{name} must be in {low}..2^53-1")


def _load(raw: object) -> tuple[JSON, bool]:
    if isinstance(raw, (bytes, bytearray, memoryview, str)):
        return parse_strict_for_jcs(raw, code="invalid_event")
    if isinstance(raw, dict):
        # A caller-built value gets exactly the checks parsed text gets.
        try:
            text = json.dumps(raw, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise _fail(f"envelope is not a JSON value: {exc}") from None
        return parse_strict_for_jcs(text, code="invalid_event")
    raise _fail("envelope must be JSON text (bytes or str) or a JSON object")


def verify_envelope(raw: object, *, options: ValidationOptions = DEFAULT_OPTIONS) -> Envelope:
    """Agent Knowledge §8.1 step 1 (Identity §6.1 steps 1–5) over one submission.

    Strict I-JSON, the closed envelope and event shape, the schema-level payload
    check (``payload.check_payload_structure``), JCS, hash and signature.
    Raises ``ProtocolError`` with ``invalid_event``, ``invalid_event_hash`` or
    ``invalid_signature``; returns the verified :class:`Envelope`.
    """
    value, plain_is_jcs = _load(raw)
    if type(value) is not dict:
        raise _fail("envelope must be a JSON object")
    if value.keys() != _ENVELOPE_KEYS:
        _closed(value, _ENVELOPE_FIELDS, _ENVELOPE_KEYS, "envelope")
    claimed = value["hash"]
    if type(claimed) is not str or not _HASH_SHAPE.fullmatch(claimed):
        raise _fail("envelope.hash must be 43 base64url characters")
    signature = value["signature"]
    if type(signature) is not str or not _SIGNATURE_SHAPE.fullmatch(signature):
        raise _fail("envelope.signature must be 86 base64url characters")
    event = value["event"]
    if type(event) is not dict:
        raise _fail("envelope.event must be an object")
    if event.keys() != _EVENT_KEYS:
        _closed(event, IDENTITY_EVENT_FIELDS, _EVENT_KEYS, "event")
    if event["protocol"] != PROTOCOL:
        raise _fail(f"event.protocol must be {PROTOCOL!r}")
    event_type = event["type"]
    if type(event_type) is not str or event_type not in EVENT_TYPES:
        raise _fail("event.type must be knowledge.publish, knowledge.assess or knowledge.retract")
    actor = event["actor"]
    if type(actor) is not str or not _AGENT_ID_SHAPE.fullmatch(actor):
        raise _fail("event.actor must be an Agent ID (did:agent: + 43 base64url characters)")
    _check_integer(event["created_at"], 0, "created_at")
    _check_integer(event["nonce"], 1, "nonce")
    payload = event["payload"]
    if type(payload) is not dict:
        raise _fail("event.payload must be an object")
    _check_payload_structure(event_type, payload, options)

    try:
        event_jcs = dumps_sorted(event) if plain_is_jcs else canonicalize(event)
    except JCSError as exc:  # pragma: no cover - strict parsing leaves nothing JCS refuses
        raise _fail(f"event cannot be canonicalized: {exc}") from None
    digest = hashlib.sha3_256(event_jcs).digest()
    event_id = b64encode(digest)
    if event_id != claimed:
        raise ProtocolError("invalid_event_hash", f"hash does not match the event: expected {event_id}, got {claimed}")
    _verify_signature(actor[len(AGENT_ID_PREFIX) :], digest, signature)
    # every member of Event was checked above and by the payload structure check
    return Envelope(event_id, cast(Event, event), signature, event_jcs)


def _verify_signature(public_key_text: str, digest: bytes, signature: str) -> None:
    # Identity §6.1 step 4: a non-canonical Agent ID is malformed (§3.3), not a bad signature.
    public_key = b64decode_canonical(public_key_text, length=32, code="invalid_event", what="event.actor public key")
    raw = b64decode_canonical(signature, length=64, code="invalid_signature", what="signature")
    if not verify_strict(public_key, digest, raw):
        raise ProtocolError("invalid_signature", "signature verification failed")


_structure_check = None


def _check_payload_structure(event_type: str, payload: dict[str, JSON], options: ValidationOptions) -> None:
    global _structure_check
    if _structure_check is None:
        # Imported lazily: the payload rules live in their own module.
        from akrelay.protocol.payload import check_payload_structure

        _structure_check = check_payload_structure
    _structure_check(event_type, payload, options)


# -- the identity layer, for events of any Agent Protocol ----------------------


def validate_event_fields(event: object, extra_fields: tuple[str, ...] | list[str] = ()) -> None:
    """The closed event object of Identity §5.1 for any protocol.

    ``extra_fields`` are the top-level fields the event's own protocol defines
    (Agent Discourse's ``room_id``, ...); anything else is ``invalid_event``.
    Values: non-empty ``protocol`` and ``type`` strings, a canonical Agent ID,
    ``created_at`` in 0..2^53−1, ``nonce`` in 1..2^53−1, an object ``payload``.
    """
    if type(event) is not dict:
        raise _fail("event must be an object")
    _closed(event, IDENTITY_EVENT_FIELDS, _EVENT_KEYS | frozenset(extra_fields), "event")
    for name in ("protocol", "type"):
        if type(event[name]) is not str or not event[name]:
            raise _fail(f"event.{name} must be a non-empty string")
    if type(event["actor"]) is not str or not _AGENT_ID_SHAPE.fullmatch(event["actor"]):
        raise _fail("event.actor must be an Agent ID (did:agent: + 43 base64url characters)")
    public_key_from_agent_id(event["actor"], code="invalid_event", what="event.actor")
    _check_integer(event["created_at"], 0, "created_at")
    _check_integer(event["nonce"], 1, "nonce")
    if type(event["payload"]) is not dict:
        raise _fail("event.payload must be an object")


def verify_hash_and_signature(envelope: object) -> str:
    """Identity §6.1 steps 2–5 on an envelope object ``{hash, event, signature}``.

    Returns the event ID. Raises ``invalid_event`` (shape, an actor that is not
    an Agent ID, a value JCS cannot represent), ``invalid_event_hash`` or
    ``invalid_signature``.
    """
    if type(envelope) is not dict:
        raise _fail("envelope must be an object")
    _closed(envelope, _ENVELOPE_FIELDS, _ENVELOPE_KEYS, "envelope")
    event, claimed, signature = envelope["event"], envelope["hash"], envelope["signature"]
    if type(event) is not dict:
        raise _fail("envelope.event must be an object")
    if type(claimed) is not str or type(signature) is not str:
        raise _fail("envelope.hash and envelope.signature must be strings")
    actor = event.get("actor")
    if type(actor) is not str or not actor.startswith(AGENT_ID_PREFIX):
        raise _fail("event.actor must be an Agent ID")
    try:
        digest = hashlib.sha3_256(canonicalize(event)).digest()
    except JCSError as exc:
        raise _fail(f"event cannot be canonicalized: {exc}") from None
    event_id = b64encode(digest)
    if event_id != claimed:
        raise ProtocolError("invalid_event_hash", f"hash does not match the event: expected {event_id}, got {claimed}")
    _verify_signature(actor[len(AGENT_ID_PREFIX) :], digest, signature)
    return event_id
