"""The wire documents of agent-knowledge/1.0 as TypedDicts (Agent Identity §5, Agent Knowledge §4–§8.3).

These describe what a *verified* document holds: ``verify_envelope`` (and ``payload.check_payload_structure``)
checked every member named here, so a reader indexes an :class:`Event` or a :class:`Payload` directly.
Unverified input is ``object`` until those checks ran. Types only: nothing here runs.

:class:`Payload` is one total=False dictionary for the three payloads (publish, assess, retract): which
members are present depends on ``event["type"]``, and the readers test the type before they read a member
that only one payload has.
"""

from __future__ import annotations

from typing import NotRequired, Protocol, TypedDict

from akrelay.jsontypes import JSONObject


class Context(TypedDict):
    scope: str
    conditions: list[str]
    limitations: list[str]


class Reproduction(TypedDict):
    environment: str
    steps: list[str]
    expected: str
    observed: NotRequired[str]


class EvidenceReference(TypedDict):
    url: str
    description: str
    digest: NotRequired[str]
    media_type: NotRequired[str]
    role: NotRequired[str]


class Relation(TypedDict):
    relation: str
    target: str


class ProfileReference(TypedDict):
    url: str
    digest: str


class ProfileBinding(TypedDict):
    profile: ProfileReference
    data: JSONObject


class Payload(TypedDict, total=False):
    """The members of the publish, assess and retract payloads (§4–§7); which are present depends on the type."""

    license: str
    # knowledge.publish
    kind: str
    title: str
    statement: str
    language: str
    tags: list[str]
    relations: list[Relation]
    # knowledge.publish and knowledge.assess
    context: Context
    basis: str
    evidence: list[EvidenceReference]
    reproduction: Reproduction
    profiles: list[ProfileBinding]
    # knowledge.assess and knowledge.retract
    target: str
    verdict: str
    summary: str
    reason: str
    extra: JSONObject


class Event(TypedDict):
    """The six Agent Identity event fields (§5.1) with a knowledge payload."""

    protocol: str
    type: str
    actor: str
    created_at: int
    nonce: int
    payload: Payload


class EnvelopeObject(TypedDict):
    """A verified envelope as a JSON object (Identity §5.2)."""

    hash: str
    event: Event
    signature: str


class AcceptanceRecord(TypedDict):
    """The §8.3 acceptance record's wire form, of a verified envelope."""

    envelope: EnvelopeObject
    accepted_at: int
    seq: int


class RecordShape(TypedDict):
    """An acceptance record from a peer or a relay after ``records.check_record_shape``: ``seq`` and
    ``accepted_at`` are checked; the envelope is an object, not verified yet."""

    envelope: dict[str, object]
    accepted_at: int
    seq: int


class HasEvent(Protocol):
    """What reads a verified event: an ``Envelope`` (named structurally where importing it would close a cycle)."""

    @property
    def event(self) -> Event: ...


__all__ = [
    "AcceptanceRecord", "Context", "EnvelopeObject", "Event", "EvidenceReference", "HasEvent", "Payload",
    "ProfileBinding", "ProfileReference", "RecordShape", "Relation", "Reproduction",
]
