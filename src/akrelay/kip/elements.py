"""The five Core element kinds (KIP §6.1) as the nexus stores them.

Elements are append-only: once created, a field never changes. The only thing that
moves is an Assertion's lifecycle, kept as a list of ``(seq, status, at)``
transitions, so the state at any earlier ``space_seq`` is a filter, not a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

#: A JSON value kept as imported: Concept attributes, facet members, the signed envelope, a
#: Proposition's object. Unchecked on purpose: the on-disk nexus decodes every element it reads
#: with msgspec by these annotations, and any narrower one makes msgspec validate each value
#: (with ``object``, a capsule Concept's decode took 9% more CPU, docs/benchmarks.md); ``JSON``,
#: a recursive alias, it cannot decode at all.
Stored: TypeAlias = Any  # Any: see above; msgspec decodes element bodies by these annotations

#: Engine origin of every imported element (§2.5): the importer, never the signer.
IMPORT_ORIGIN_PRINCIPAL = "akrelay:importer"
IMPORT_CHANNEL = "agent-knowledge/1.0"


@dataclass(slots=True)
class Concept:
    id: str
    type: str                  # local type name: "Agent" | "KnowledgeCapsule"
    schema_ref: str
    key: str
    name: str
    attributes: dict[str, Stored]
    structural: dict[str, str]  # structural field -> element id
    created_seq: int
    created_at: str
    import_id: str             # the event that created it


@dataclass(slots=True)
class Proposition:
    id: str
    subject: str               # Concept id
    predicate: str             # local predicate name
    predicate_ref: str
    object: Stored             # True, or {"id": element id}
    created_seq: int
    created_at: str
    import_id: str


@dataclass(slots=True)
class Assertion:
    id: str
    proposition: str
    asserted_by: str           # Agent Concept id
    actor: str                 # the signer's did:agent: ID (kept for trust lookups)
    stance: str
    asserted_at: str
    evidence: list[dict[str, str]]
    facets: dict[str, dict[str, Stored]]
    created_seq: int
    created_at: str
    import_id: str             # the event the Assertion was derived from
    transitions: list[tuple[int, str, str]] = field(default_factory=list)

    def status_at(self, seq: int) -> str:
        status = "active"
        for t_seq, t_status, _ in self.transitions:
            if t_seq <= seq:
                status = t_status
        return status

    def retracted_at(self, seq: int) -> str | None:
        for t_seq, t_status, at in self.transitions:
            if t_seq <= seq and t_status == "retracted":
                return at
        return None


@dataclass(slots=True)
class Evidence:
    id: str
    evidence_class: str
    envelope: dict[str, Stored]  # the exact signed envelope
    content_digest: str
    observed_at: str
    source: str                # Agent Concept id of the signer
    client_key: str
    facets: dict[str, dict[str, Stored]]
    created_seq: int
    created_at: str
    import_id: str


@dataclass(slots=True)
class Activity:
    id: str
    activity_class: str
    started_at: str
    ended_at: str
    outputs: list[str]
    associated_actors: list[str]
    created_seq: int
    created_at: str
    import_id: str


Element = Concept | Proposition | Assertion | Evidence | Activity

KIND_OF = {Concept: "concept", Proposition: "proposition", Assertion: "assertion",
           Evidence: "evidence", Activity: "activity"}
