"""Epistemic projection (KIP §21) over imported Assertions.

Three structural policies, all numeric-free (``score: null``):

* ``kip:structural`` v1, the baseline of §21.10;
* ``kip:memory-default`` v1 (§21.13): the baseline plus precedence rules that only
  resolve conflict sets of functional slots; every akrelay predicate is
  non-functional, so it agrees with the baseline, and says so in its ledger;
* ``akrelay:corroborated`` v1 (default): the baseline, except that support coming
  only from the capsule's own author, with nothing opposing it, is ``uncertain``
  (reason ``uncorroborated``): acceptance needs another actor's support.

Independence (§23): one root group per actor, so an actor repeating itself never
corroborates itself (§88.10). Imported Assertions are eligible under all three
policies — they are the only cognition this Space has — while the operator's
``blocked`` trust class makes an actor's Assertions ineligible (§22.3: trust is
operator state, never content).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias, TypedDict

from akrelay.jsontypes import JSON
from akrelay.kip.space import TrustState
from akrelay.kip.elements import Assertion, Concept, Proposition
from akrelay.kip.errors import KipError
from akrelay.kip.nexus import NexusBase

#: A §27.2 projection document. Its readers (``kql.belief``, ``knowql.retrieval``, the explorer)
#: read it by nested keys and ``kql.belief`` trims and rewrites its members in place, so a
#: TypedDict here would need those modules changed with it (issue 25, left for their owners).
Projection: TypeAlias = dict[str, Any]  # Any: nested members read, trimmed and rewritten by key by three consumers


class RootGroup(TypedDict):
    """One independence root (§23): an actor and the Assertions it contributed."""

    root: str
    assertion_ids: list[str]


@dataclass(frozen=True, slots=True)
class Policy:
    id: str
    version: int
    description: str
    author_corroboration: bool

    def identity(self) -> dict[str, JSON]:
        return {"id": self.id, "version": self.version}

    def describe(self) -> dict[str, JSON]:
        return {
            "id": self.id, "version": self.version, "description": self.description,
            "deterministic": True, "score_model": "none", "score_semantics": None,
            "eligibility": {"lifecycle": ["active"], "modes": ["imported"],
                            "trust_classes": {"trusted": "eligible", "unknown": "eligible", "blocked": "ineligible"}},
            "independence": {"unit": "actor", "root_groups": "one per asserting actor"},
            "status_rules": [
                "no eligible Assertion -> insufficient",
                "support and reject -> contested; leading = side with more root groups, none on a tie",
                "reject only -> rejected",
                ("support only -> accepted; if every support root is the capsule's author -> uncertain "
                 "(uncorroborated)") if self.author_corroboration else "support only -> accepted",
                "uncertain only -> uncertain",
            ],
            "conflict_resolution": ("precedence rules of §21.13 (context specificity, first-person, recency) "
                                    "apply to functional slots only; akrelay predicates are non-functional")
            if self.id == "kip:memory-default" else "none (structural baseline, §21.10)",
        }


POLICIES: dict[str, Policy] = {
    p.id: p for p in (
        Policy("kip:structural", 1, "The structural projection baseline (KIP §21.10).", False),
        Policy("kip:memory-default", 1, "The standard memory policy (KIP §21.13).", False),
        Policy("akrelay:corroborated", 1,
               "akrelay's default: the structural baseline, but acceptance needs support from an actor other "
               "than the capsule's author.", True),
    )
}


def policy(name: str | None, default: str) -> Policy:
    chosen = POLICIES.get(name or default)
    if chosen is None:
        raise KipError("ProjectionPolicyUnavailable", f"no epistemic policy {name!r}",
                       details={"available": sorted(POLICIES)})
    return chosen


def _groups(assertions: list[Assertion]) -> list[RootGroup]:
    by_actor: dict[str, list[str]] = {}
    for a in assertions:
        by_actor.setdefault(a.actor, []).append(a.id)
    return [{"root": f"actor:{actor}", "assertion_ids": ids} for actor, ids in sorted(by_actor.items())]


def project(nexus: NexusBase, proposition_id: str, *, trust: TrustState, policy_name: str | None = None,
            default_policy: str = "akrelay:corroborated", as_of: int | None = None,
            schema_environment_version: int = 1, purpose: str | None = None, risk: str | None = None) -> Projection:
    """The §27.2 projection of one Proposition at ``as_of`` (head by default)."""
    seq = nexus.check_seq(as_of)
    pol = policy(policy_name, default_policy)
    prop = nexus.get(proposition_id, seq)
    if not isinstance(prop, Proposition):
        raise KipError("NotFoundOrNotVisible", f"no Proposition {proposition_id!r} at space_seq {seq}")
    subject = nexus.get(prop.subject)
    author = None
    if isinstance(subject, Concept) and "ak_published_by" in subject.structural:
        author = nexus.get(subject.structural["ak_published_by"]).key  # type: ignore[union-attr]

    support: list[Assertion] = []
    opposition: list[Assertion] = []
    uncertain: list[Assertion] = []
    exclusions: list[dict[str, str]] = []
    trust_decisions: dict[str, str] = {}
    for a in nexus.assertions_on(prop.id, seq):
        cls = trust.of(a.actor)
        trust_decisions[a.actor] = cls
        status = a.status_at(seq)
        if status != "active":
            exclusions.append({"assertion_id": a.id, "reason": status})
            continue
        if nexus.is_withheld(a.import_id):
            exclusions.append({"assertion_id": a.id, "reason": "withheld"})
            continue
        if cls == "blocked":
            exclusions.append({"assertion_id": a.id, "reason": "blocked_actor"})
            continue
        {"support": support, "reject": opposition, "uncertain": uncertain}[a.stance].append(a)

    sup_groups, opp_groups = _groups(support), _groups(opposition)
    reasons: list[str] = []
    if support and opposition:
        status = "contested"
        leading = ("support" if len(sup_groups) > len(opp_groups)
                   else "opposition" if len(opp_groups) > len(sup_groups) else "none")
    elif opposition:
        status, leading = "rejected", "opposition"
    elif support:
        if pol.author_corroboration and author is not None and all(a.actor == author for a in support):
            status, leading = "uncertain", "none"
            reasons.append("uncorroborated")
        else:
            status, leading = "accepted", "support"
    elif uncertain:
        status, leading = "uncertain", "none"
    else:
        status, leading = "insufficient", "none"
    if uncertain and status != "insufficient":
        reasons.append("uncertain_material")

    tx = nexus.transaction_at(seq)
    return {
        "proposition": {"id": prop.id},
        "status": status,
        "candidate_status": status,
        "slot_status": status,
        "conflict_refs": [],
        "conflict_reasons": [],
        "leading": leading,
        "support": {"score": None, "score_semantics": None, "assertion_ids": [a.id for a in support],
                    "root_groups": sup_groups},
        "opposition": {"score": None, "score_semantics": None, "assertion_ids": [a.id for a in opposition],
                       "root_groups": opp_groups},
        "uncertainty": {"level": None, "reasons": reasons,
                        "assertion_ids": [a.id for a in uncertain], "root_groups": _groups(uncertain)},
        "explanation": {
            "ledger": {
                "contributing": [a.id for a in support], "opposing": [a.id for a in opposition],
                "uncertain": [a.id for a in uncertain], "eligibility_exclusions": exclusions,
                "trust_decisions": [{"actor": k, "class": v} for k, v in sorted(trust_decisions.items())],
                "capsule_author": author,
                "rules": pol.describe()["status_rules"],
            },
        },
        "basis": {
            "space_id": nexus.space_id,
            "snapshot_seq": seq,
            "schema_environment_version": schema_environment_version,
            "identity_resolution_version": 0,
            "policy": pol.identity(),
            "trust_state_version": trust.version,
            "authorization_view": "public",
            "context_refs": [],
            "purpose": purpose,
            "risk": risk,
            "valid_at": tx.committed_at if tx else None,
            "next_invalid_at": None,
        },
    }
