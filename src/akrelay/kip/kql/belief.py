"""BELIEF and BELIEF SLOT values (§46, §47) over the runtime's projection.

A belief is virtual: it is computed by ``akrelay.kip.projection.project`` at the
query's snapshot under the policy named in ``WITH EPISTEMIC`` (or the runtime's
default) and is never stored (§46.2). ``FOR TIME`` is recorded in the basis as
``valid_at`` (§48.2, §50): imported Assertions carry no valid time (§25.2), so
world time does not change which Assertions are eligible, only the recorded
coordinate. The explanation level (§49.1) trims the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Hashable
from typing import Any, TypeAlias

from akrelay.kip.elements import Proposition
from akrelay.kip.kql.host import KqlRuntime
from akrelay.kip.projection import POLICIES, policy as resolve_policy, project

#: A §27.2 projection document, a slot document or a §21.12 ProjectionBasis: nested JSON objects
#: read and trimmed here by key, as ``akrelay.kip.projection.project`` builds them.
ProjectionDocument: TypeAlias = dict[str, Any]  # Any: project() returns it untyped; nested objects read by key


@dataclass(frozen=True, slots=True)
class Settings:
    """The epistemic settings of one query (``WITH EPISTEMIC`` + ``FOR TIME``)."""

    policy: str | None = None
    purpose: str | None = None
    risk: str | None = None
    explanation: str | None = None
    for_time: str | None = None


@dataclass(frozen=True, slots=True)
class BeliefValue:
    """A virtual Belief or Slot binding; ``key`` identifies target + basis (§42.5)."""

    data: ProjectionDocument
    key: tuple[Hashable, ...]


def _finish(data: ProjectionDocument, settings: Settings) -> ProjectionDocument:
    if settings.for_time is not None:
        data["basis"]["valid_at"] = settings.for_time
    if settings.explanation == "none":
        data["explanation"] = {"level": "none", "redacted": True}
    elif settings.explanation == "summary":
        ledger = data.get("explanation", {}).get("ledger", {})
        data["explanation"] = {"level": "summary", "redacted": True,
                               "counts": {k: len(ledger.get(k, [])) for k in ("contributing", "opposing", "uncertain")}}
    return data


def basis(rt: KqlRuntime, seq: int, settings: Settings) -> ProjectionDocument:
    """The §21.12 ProjectionBasis of a query that used projection."""
    pol = resolve_policy(settings.policy, rt.config.default_policy)
    tx = rt.nexus.transaction_at(seq)
    return {
        "space_id": rt.nexus.space_id, "snapshot_seq": seq,
        "schema_environment_version": rt.environment.version, "identity_resolution_version": 0,
        "policy": pol.identity(), "trust_state_version": rt.config.trust.version,
        "authorization_view": "public", "context_refs": [], "purpose": settings.purpose, "risk": settings.risk,
        "valid_at": settings.for_time if settings.for_time is not None else (tx.committed_at if tx else None),
        "next_invalid_at": None,
    }


def belief(rt: KqlRuntime, proposition_id: str, seq: int, settings: Settings) -> BeliefValue:
    data = project(rt.nexus, proposition_id, trust=rt.config.trust, policy_name=settings.policy,
                   default_policy=rt.config.default_policy, as_of=seq,
                   schema_environment_version=rt.environment.version, purpose=settings.purpose,
                   risk=settings.risk)
    data = _finish(data, settings)
    return BeliefValue(data, ("belief", proposition_id, _basis_key(data["basis"])))


def missing_belief(rt: KqlRuntime, subject_id: str, predicate_ref: str, obj: object, seq: int,
                   settings: Settings) -> BeliefValue:
    """§46.4: a fully grounded tuple with no Proposition is ``insufficient``; nothing is created."""
    b = basis(rt, seq, settings)
    data: ProjectionDocument = {
        "proposition": None, "proposition_id": None,
        "target": {"subject": {"id": subject_id}, "predicate_ref": predicate_ref, "object": obj},
        "status": "insufficient", "candidate_status": "insufficient", "slot_status": "insufficient",
        "conflict_refs": [], "conflict_reasons": [], "leading": "none",
        "support": {"score": None, "score_semantics": None, "assertion_ids": [], "root_groups": []},
        "opposition": {"score": None, "score_semantics": None, "assertion_ids": [], "root_groups": []},
        "uncertainty": {"level": None, "reasons": ["no_proposition"], "assertion_ids": [], "root_groups": []},
        "explanation": {"ledger": {"contributing": [], "opposing": [], "uncertain": [],
                                   "eligibility_exclusions": [], "note": "no durable Proposition exists"}},
        "basis": b,
    }
    data = _finish(data, settings)
    return BeliefValue(data, ("belief-missing", subject_id, predicate_ref, repr(obj), _basis_key(b)))


def slot(rt: KqlRuntime, subject_id: str, predicate_local: str, predicate_ref: str, seq: int,
         settings: Settings) -> BeliefValue:
    """§47: the candidate set of one (subject, predicate) slot.

    akrelay's predicates are non-functional, so candidates never conflict with
    each other: the slot is ``accepted`` when any candidate is accepted (all
    accepted values are listed), else ``contested`` / ``uncertain`` when any
    candidate is, else ``insufficient`` (a slot is never ``rejected``).
    """
    candidates = []
    for prop in rt.nexus.propositions_about(subject_id, seq):
        if prop.predicate == predicate_local:
            candidates.append(belief(rt, prop.id, seq, settings).data)
    candidates.sort(key=lambda c: c["proposition"]["id"])
    statuses = {c["status"] for c in candidates}
    if "accepted" in statuses:
        status = "accepted"
    elif "contested" in statuses:
        status = "contested"
    elif "uncertain" in statuses:
        status = "uncertain"
    else:
        status = "insufficient"
    accepted_values = [_proposition(rt, c["proposition"]["id"]).object for c in candidates
                       if c["status"] == "accepted"]
    b = basis(rt, seq, settings)
    data = {
        "status": status, "accepted_values": accepted_values, "candidate_projections": candidates,
        "subject": {"id": subject_id}, "predicate_ref": predicate_ref,
        "uncertainty": {"reasons": sorted(s for s in statuses if s not in ("accepted",))},
        "explanation": {"functional": False, "candidates": len(candidates),
                        "rule": "non-functional slot: accepted if any candidate is accepted"},
        "basis": b,
    }
    return BeliefValue(data, ("slot", subject_id, predicate_ref, _basis_key(b)))


def _proposition(rt: KqlRuntime, proposition_id: str) -> Proposition:
    element = rt.nexus.get(proposition_id)
    if not isinstance(element, Proposition):
        raise AssertionError(f"{proposition_id} is not a Proposition")  # pragma: no cover - a candidate is one
    return element


def _basis_key(b: ProjectionDocument) -> tuple[Hashable, ...]:
    return (b["snapshot_seq"], b["policy"]["id"], b["policy"]["version"], b["trust_state_version"],
            b["valid_at"], b["purpose"], b["risk"])


__all__ = ["POLICIES", "BeliefValue", "Settings", "basis", "belief", "missing_belief", "slot"]
