"""Retrieval for one turn: ranked question hits over one snapshot, joined with the KIP nexus.

The snapshot is one acceptance ``seq``: the lower of the nexus head and the
search index position, so that ranking, projection and composition all see
the same log prefix (the nexus answers historical reads at any seq). Hits
come from the search index's question mode (BM25, words OR-ed, stop words
dropped); the nexus supplies the capsules, their relations and their
BELIEF projections under the session's policy.

What never appears as support: retractions (not searched), withheld records
(skipped by the search and by the nexus), an assessment whose Assertion its
author retracted, and a capsule its author retracted. A scope keeps a capsule
when any of its contexts matches the capsule's publish event; an assessment
follows the capsule it assesses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence, TypedDict

from akrelay.kip.elements import Assertion, Evidence
from akrelay.kip.package import AK_PACKAGE_REF
from akrelay.knowql.answer_types import Artifact, Belief, Chunk, Detail
from akrelay.knowql.contexts import Context
from akrelay.protocol.payload import ASSESS, PUBLISH
from akrelay.search.question import question_terms

if TYPE_CHECKING:  # annotations only: importing these at run time would load the KIP runtime and search early
    from akrelay.kip.nexus import NexusBase
    from akrelay.kip.runtime import KipRuntime
    from akrelay.search.engine import SearchEngine
    from akrelay.store.base import Record, Store

#: A hit found only through the history variant counts for half as much.
HISTORY_WEIGHT = 0.5
#: Words borrowed from the previous asks of a session.
HISTORY_TERMS = 8
_EVENT_FACET = f"{AK_PACKAGE_REF}/AkEvent"


class _Capsule(TypedDict):
    """A capsule being gathered from the hits: its publication, best score, contexts and passages."""

    record: Record
    score: float
    contexts: list[str]
    chunks: list[Chunk]


@dataclass
class Retrieval:
    snapshot_seq: int
    index_seq: int
    policy: str
    query_variants: list[str]
    keyword_query: str | None
    chunks: list[Chunk] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    #: per capsule (publish event ID): ``basis``, supporting/challenging ``assessments`` among the hits,
    #: ``related`` (relation targets), ``tags`` and the context ``scope``: what the composer reads
    #: beyond the statement. Not part of the retrieval envelope.
    details: dict[str, Detail] = field(default_factory=dict)
    #: the same members for the capsules the previous answer cited (a follow-up prefers their neighbours)
    previous: dict[str, Detail] = field(default_factory=dict)

    @property
    def matched_artifacts(self) -> list[str]:
        return [a["id"] for a in self.artifacts]


def history_variant(ask: str, history: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """The ask plus the salient words of the previous one or two asks (seed 000 §5.2(2))."""
    own = question_terms(ask)
    if not own or not history:
        return None
    extra: dict[str, None] = {}
    for previous in reversed(history[-2:]):
        for term in question_terms(previous):
            if term not in own:
                extra.setdefault(term, None)
    borrowed = tuple(extra)[:HISTORY_TERMS]
    if not borrowed:
        return None
    return ask + " " + " ".join(borrowed), (own + borrowed)[:16]


def retracted(nexus: NexusBase, event_id: str, seq: int) -> bool:
    """Whether every Assertion derived from ``event_id`` was retracted by its author at ``seq``."""
    assertions = nexus.assertions_from_event(event_id)
    if not assertions:
        return False
    return all(a.created_seq > seq or a.status_at(seq) == "retracted" for a in assertions)


def _assessment_counts(nexus: NexusBase, assertion_ids: Sequence[str]) -> int:
    """How many of ``assertion_ids`` come from assessments (not the author's own publication)."""
    count = 0
    for aid in assertion_ids:
        assertion = nexus.get(aid)
        if not isinstance(assertion, Assertion) or not assertion.evidence:
            continue
        evidence = nexus.get(assertion.evidence[0]["id"])
        if isinstance(evidence, Evidence) and evidence.facets.get(_EVENT_FACET, {}).get("event_type") == ASSESS:
            count += 1
    return count


def _detail(record: Record, chunks: Sequence[Chunk] = ()) -> Detail:
    payload = record.envelope.payload
    stated = payload.get("context")
    context: Mapping[str, object] = stated if isinstance(stated, dict) else {}
    basis = payload.get("basis")
    return {"basis": basis if isinstance(basis, str) else "",
            "assessments": [{"source": c["source"], "verdict": c.get("verdict"), "text": c["text"]}
                            for c in chunks if c["kind"] == "assessment"],
            "related": sorted({r["target"] for r in payload.get("relations") or () if isinstance(r, dict)
                               and isinstance(r.get("target"), str)}),
            "tags": sorted(t for t in payload.get("tags") or () if isinstance(t, str)),
            "scope": scope if isinstance(scope := context.get("scope"), str) else None}


def retrieve(*, ask: str, history: Sequence[str], scope: Sequence[Context], search: SearchEngine,
             runtime: KipRuntime, store: Store,
             policy: str, limit: int, origin: str, previous: Sequence[str] = ()) -> Retrieval:
    """Retrieve for ``ask`` at one snapshot; ``limit`` artifacts (and their chunks) at most.

    ``previous`` names the capsules the session's previous answer cited; their details are read so that
    the composer can prefer related capsules in a follow-up.
    """
    nexus = runtime.nexus
    index_seq = search.index_seq()
    with runtime.lock:
        snapshot = min(nexus.head, index_seq)
    terms = question_terms(ask)
    variants = [ask]
    result = Retrieval(snapshot, index_seq, policy, variants, " ".join(terms) if terms else None)
    if not terms or snapshot < 1:
        return result
    if previous:
        for event_id, record in store.get_many(sorted(set(previous))).items():
            if record is not None and not record.withheld and record.envelope.type == PUBLISH:
                result.previous[event_id] = _detail(record)
    runs: list[tuple[tuple[str, ...], float]] = [(terms, 1.0)]
    extra = history_variant(ask, history)
    if extra is not None:
        variants.append(extra[0])
        runs.append((extra[1], HISTORY_WEIGHT))
    wanted = max(limit * 2, 20)  # records: a capsule's publication and its assessments
    best: dict[str, tuple[float, int, Record]] = {}
    for words, weight in runs:
        hits, _ = search.question(words, snapshot, wanted, types=(PUBLISH, ASSESS))
        for hit in hits:
            score = round(hit.score * weight, 6)
            known = best.get(hit.record.id)
            if known is None or score > known[0]:
                best[hit.record.id] = (score, hit.record.seq, hit.record)
    ranked = sorted(best.values(), key=lambda item: (-item[0], item[1]))

    targets = store.get_many(sorted({r.envelope.payload["target"] for _, _, r in ranked
                                     if r.envelope.type != PUBLISH}))
    capsules: dict[str, _Capsule] = {}
    with runtime.lock:
        for score, seq, record in ranked:
            envelope = record.envelope
            payload = envelope.payload
            if envelope.type == PUBLISH:
                capsule_record = record
            else:
                target = targets.get(payload["target"])
                if target is None or target.withheld or target.seq > snapshot or target.envelope.type != PUBLISH:
                    continue
                capsule_record = target
            capsule_id = capsule_record.id
            if retracted(nexus, record.id, snapshot) or retracted(nexus, capsule_id, snapshot):
                continue
            contexts = [c.slug for c in scope if c.matches(capsule_record.envelope)]
            if not contexts:
                continue
            entry = capsules.get(capsule_id)
            if entry is None:
                if len(capsules) >= limit:
                    continue
                entry = capsules[capsule_id] = {"record": capsule_record, "score": score, "contexts": contexts,
                                                "chunks": []}
            entry["chunks"].append(_chunk(record, capsule_record, score, contexts, origin))
        for rank, (capsule_id, entry) in enumerate(capsules.items(), start=1):
            artifact = _artifact(runtime, entry, snapshot, policy, origin)
            if artifact is None:
                continue
            artifact["rank"] = len(result.artifacts) + 1
            result.artifacts.append(artifact)
            result.details[artifact["source"]] = _detail(entry["record"], entry["chunks"])
            result.chunks.extend(entry["chunks"])
    result.chunks.sort(key=lambda c: (-c["score"], c["seq"]))
    for rank, chunk in enumerate(result.chunks, start=1):
        chunk["rank"] = rank
    return result


def _url(origin: str, event_id: str) -> str:
    return f"{origin}/v1/knowledge/events/{event_id}"


def _chunk(record: Record, capsule: Record, score: float, contexts: list[str], origin: str) -> Chunk:
    payload = record.envelope.payload
    publish = record.envelope.type == PUBLISH
    chunk: Chunk = {"id": record.id, "source": record.id, "kind": "capsule" if publish else "assessment",
             "capsule": capsule.id, "context": contexts, "title": capsule.envelope.payload["title"],
             "text": payload["statement"] if publish else payload["summary"], "score": score, "seq": record.seq,
             "url": _url(origin, record.id)}
    if not publish:
        chunk["verdict"] = payload["verdict"]
    return chunk


def _artifact(runtime: KipRuntime, entry: _Capsule, seq: int, policy: str, origin: str) -> Artifact | None:
    nexus = runtime.nexus
    record = entry["record"]
    concept = nexus.capsule(record.id, seq)
    if concept is None:
        return None
    payload = record.envelope.payload
    holds = nexus.holds(record.id, seq)
    if holds is not None:
        projection = runtime.project(holds.id, policy=policy, as_of=seq)
        belief: Belief = {"status": projection["status"], "leading": projection["leading"],
                          "supporting": _assessment_counts(nexus, projection["support"]["assertion_ids"]),
                          "rejecting": _assessment_counts(nexus, projection["opposition"]["assertion_ids"]),
                          "reasons": list(projection["uncertainty"]["reasons"]), "policy": policy, "snapshot_seq": seq}
    else:
        belief = {"status": "insufficient", "leading": "none", "supporting": 0, "rejecting": 0, "reasons": [],
                  "policy": policy, "snapshot_seq": seq}
    return {"id": concept.id, "source": record.id, "type": "KnowledgeCapsule", "name": payload["title"],
            "kind": payload["kind"], "text": payload["statement"], "context": entry["contexts"],
            "score": entry["score"], "seq": record.seq, "url": _url(origin, record.id), "belief": belief}
