"""The mapping of one accepted agent-knowledge event to one KIP import transaction.

Every event, whatever its type, yields an ``agent_statement`` Evidence holding the
exact signed envelope (client key ``ak:<hash>``, §7.5, §23.1) and an ``import``
Activity with no inputs (§16). Then:

* publish: Agent and KnowledgeCapsule Concepts, ``(C, ak_holds, true)`` and one
  relation Proposition per relation, with the author's Assertions;
* assess: the assessor's Assertion on the target's ``ak_holds``;
* retract: the retracting actor's own Assertions derived from the target move to
  ``retracted`` (§14.1, §57.3) and nothing else changes.

Assertions are ``mode: "imported"`` (§26.3), attributed to the signer's Agent
Concept, timed by the signer's ``created_at`` (§13.2), and carry no confidence,
valid time or context (§13.3, §13.6, §25.2). Nothing here reads the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from akrelay.jsontypes import JSONObject
from akrelay.kip.elements import Activity, Assertion, Concept, Evidence, Proposition
from akrelay.kip.nexus import NexusBase, Transaction
from akrelay.kip.space import AK_PACKAGE_REF
from akrelay.kip.timefmt import kip_timestamp
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.payload import RELATION_NAMES

_E = TypeVar("_E", Concept, Proposition, Assertion, Evidence, Activity)


class AcceptedRecord(Protocol):
    """What the mapping reads of an acceptance record (``akrelay.store.Record``, a layer above)."""

    @property
    def seq(self) -> int: ...

    @property
    def accepted_at(self) -> int: ...

    @property
    def envelope(self) -> Envelope: ...

_PKG = AK_PACKAGE_REF

#: Author stance on ``ak_holds`` by capsule kind; ``None``: not truth-apt, no Assertion.
KIND_STANCE: dict[str, str | None] = {"hypothesis": "uncertain", "question": None, "collection": None}
#: Assessor stance by verdict.
VERDICT_STANCE = {"supports": "support", "reproduced": "support", "challenges": "reject",
                  "not_reproduced": "reject", "applied": "uncertain", "inconclusive": "uncertain"}
RELATIONS = RELATION_NAMES  # one list, the protocol core's


def ref(symbol: str) -> str:
    return f"{_PKG}/{symbol}"


@dataclass(frozen=True, slots=True)
class ImportResult:
    seq: int
    event_id: str
    status: str                        # "committed" | "no_effect" | "skipped"
    created: tuple[str, ...] = ()
    retracted: tuple[str, ...] = ()


class _Tx:
    """Allocates deterministic element ids ``<prefix><seq>.<n>`` inside one transaction."""

    def __init__(self, nexus: NexusBase, seq: int, at: str, event_id: str) -> None:
        self.nexus, self.seq, self.at, self.event_id = nexus, seq, at, event_id
        self.n = 0
        self.created: list[str] = []

    def new_id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.seq}.{self.n}"

    def add(self, element: _E, text: str | None = None) -> _E:
        self.nexus.add(element, text)
        self.created.append(element.id)
        return element


def import_record(nexus: NexusBase, record: AcceptedRecord) -> ImportResult:
    """Apply one acceptance record (``seq``, ``accepted_at``, ``envelope``) to ``nexus``.

    Records at or below the head are skipped (a follower re-reading a batch); a
    re-delivered event whose Evidence already exists commits nothing (§23.1). The
    record is one write unit of the backend, or part of the caller's ``nexus.batch()``.
    """
    with nexus.batch():
        return _import(nexus, record)


def _import(nexus: NexusBase, record: AcceptedRecord) -> ImportResult:
    envelope = record.envelope
    if record.seq <= nexus.head:
        return ImportResult(record.seq, envelope.id, "skipped")
    committed_at = kip_timestamp(record.accepted_at)
    if nexus.evidence_by_key("ak:" + envelope.id) is not None:
        nexus.commit(Transaction(record.seq, f"tx-{record.seq}", committed_at, envelope.id, envelope.type, "no_effect"))
        return ImportResult(record.seq, envelope.id, "no_effect")

    tx = _Tx(nexus, record.seq, committed_at, envelope.id)
    agent = _agent(tx, envelope.actor)
    evidence = _evidence(tx, record, agent)
    retracted: list[str] = []
    kind = envelope.type
    if kind == "knowledge.publish":
        _publish(tx, envelope, agent, evidence)
    elif kind == "knowledge.assess":
        _assess(tx, envelope, agent, evidence)
    elif kind == "knowledge.retract":
        retracted = _retract(tx, envelope, agent)
    outputs = list(tx.created)
    tx.add(Activity(id=tx.new_id("x"), activity_class="import", started_at=committed_at, ended_at=committed_at,
                    outputs=outputs, associated_actors=[agent.id], created_seq=tx.seq, created_at=committed_at,
                    import_id=envelope.id))
    nexus.commit(Transaction(record.seq, f"tx-{record.seq}", committed_at, envelope.id, kind, "committed"))
    return ImportResult(record.seq, envelope.id, "committed", tuple(tx.created), tuple(retracted))


def _agent(tx: _Tx, actor: str) -> Concept:
    existing = tx.nexus.agent(actor)
    if existing is not None:
        return existing
    concept = Concept(id=tx.new_id("c"), type="Agent", schema_ref=ref("Agent"), key=actor, name=actor,
                      attributes={}, structural={}, created_seq=tx.seq, created_at=tx.at, import_id=tx.event_id)
    return tx.add(concept, f"{actor} agent")


def _evidence(tx: _Tx, record: AcceptedRecord, agent: Concept) -> Evidence:
    env = record.envelope
    payload = env.payload
    facet = {"event_id": env.id, "event_type": env.type, "actor": env.actor, "nonce": env.nonce,
             "created_at": kip_timestamp(env.created_at), "seq": record.seq, "accepted_at": tx.at}
    evidence = Evidence(id=tx.new_id("e"), evidence_class="agent_statement", envelope=dict(env.to_dict()),
                        content_digest="sha3-256:" + env.id, observed_at=tx.at, source=agent.id,
                        client_key="ak:" + env.id, facets={ref("AkEvent"): facet}, created_seq=tx.seq,
                        created_at=tx.at, import_id=env.id)
    text = " ".join([env.id, env.type] + [str(payload[k]) for k in
                    ("title", "statement", "summary", "reason", "verdict", "kind", "basis") if k in payload])
    return tx.add(evidence, text)


def _capsule_concept(tx: _Tx, event_id: str) -> Concept:
    """Resolve the capsule Concept of ``event_id``, minting a bare one if it was never imported."""
    existing = tx.nexus.capsule(event_id)
    if existing is not None:
        return existing
    concept = Concept(id=tx.new_id("c"), type="KnowledgeCapsule", schema_ref=ref("KnowledgeCapsule"),
                      key=event_id, name=event_id, attributes={}, structural={}, created_seq=tx.seq,
                      created_at=tx.at, import_id=tx.event_id)
    return tx.add(concept, event_id)


def _proposition(tx: _Tx, subject: Concept, predicate: str, obj: bool | dict[str, str], object_name: str) -> Proposition:
    nexus = tx.nexus
    existing = nexus.proposition(subject.id, predicate, obj)
    if existing is not None:
        return existing
    prop = Proposition(id=tx.new_id("p"), subject=subject.id, predicate=predicate, predicate_ref=ref(predicate),
                       object=obj, created_seq=tx.seq, created_at=tx.at, import_id=tx.event_id)
    return tx.add(prop, f"{predicate.replace('_', ' ')} {subject.name} {object_name}")


def _assertion(tx: _Tx, prop: Proposition, agent: Concept, stance: str, asserted_at: str, evidence: Evidence,
               facets: dict[str, JSONObject] | None = None, text: str = "") -> Assertion:
    assertion = Assertion(id=tx.new_id("a"), proposition=prop.id, asserted_by=agent.id, actor=agent.key,
                          stance=stance, asserted_at=asserted_at,
                          evidence=[{"id": evidence.id, "role": "support"}], facets=facets or {},
                          created_seq=tx.seq, created_at=tx.at, import_id=tx.event_id)
    return tx.add(assertion, f"{stance} {prop.predicate} {text}")


def _publish(tx: _Tx, env: Envelope, agent: Concept, evidence: Evidence) -> None:
    p = env.payload
    ctx = p.get("context", {})
    attributes = {
        "kind": p["kind"], "title": p["title"], "statement": p["statement"], "language": p["language"],
        "licence": p["license"], "context_scope": ctx.get("scope"), "conditions": list(ctx.get("conditions", [])),
        "limitations": list(ctx.get("limitations", [])), "basis": p["basis"], "tags": list(p.get("tags", [])),
        "created_at": kip_timestamp(env.created_at),
    }
    nexus = tx.nexus
    capsule = nexus.capsule(env.id)
    if capsule is None:
        capsule = Concept(id=tx.new_id("c"), type="KnowledgeCapsule", schema_ref=ref("KnowledgeCapsule"),
                          key=env.id, name=p["title"], attributes=attributes,
                          structural={"ak_published_by": agent.id}, created_seq=tx.seq, created_at=tx.at,
                          import_id=env.id)
        text = " ".join([env.id, p["title"], p["statement"], p["kind"], str(ctx.get("scope", "")),
                         " ".join(p.get("tags", []))])
        tx.add(capsule, text)
    asserted_at = kip_timestamp(env.created_at)
    holds = _proposition(tx, capsule, "ak_holds", True, "true")
    stance = KIND_STANCE.get(p["kind"], "support")
    if stance is not None:
        _assertion(tx, holds, agent, stance, asserted_at, evidence)
    for rel in p.get("relations", []):
        target = rel["target"]
        target_evidence = nexus.evidence_for_event(target)
        if target_evidence is not None and target_evidence.facets[ref("AkEvent")]["event_type"] == "knowledge.assess":
            obj, name = {"id": target_evidence.id}, target
        else:
            target_concept = _capsule_concept(tx, target)
            obj, name = {"id": target_concept.id}, target_concept.name
        prop = _proposition(tx, capsule, "ak_" + rel["relation"], obj, name)
        _assertion(tx, prop, agent, "support", asserted_at, evidence)


def _assess(tx: _Tx, env: Envelope, agent: Concept, evidence: Evidence) -> None:
    p = env.payload
    capsule = _capsule_concept(tx, p["target"])
    holds = _proposition(tx, capsule, "ak_holds", True, "true")
    facet: JSONObject = {"verdict": p["verdict"], "summary": p["summary"]}
    _assertion(tx, holds, agent, VERDICT_STANCE[p["verdict"]], kip_timestamp(env.created_at), evidence,
               facets={ref("AkAssessment"): facet}, text=f"{p['verdict']} {p['summary']}")


def _retract(tx: _Tx, env: Envelope, agent: Concept) -> list[str]:
    """Withdraw the retracting actor's own active Assertions derived from the target."""
    nexus = tx.nexus
    at = kip_timestamp(env.created_at)
    moved = []
    for assertion in nexus.assertions_from_event(env.payload["target"]):
        if assertion.asserted_by == agent.id and assertion.status_at(tx.seq) == "active":
            nexus.add_transition(assertion, tx.seq, "retracted", at)
            moved.append(assertion.id)
    return moved
