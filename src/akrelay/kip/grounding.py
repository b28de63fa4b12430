"""Keyword SEARCH over the nexus (§66): grounding text, scores, freshness.

The index is maintained inside each import transaction, so it is exactly as fresh
as the nexus (``index_seq`` == snapshot seq, consistency ``synchronous``), and as
entries are immutable and tagged with their creation seq, a search ``AS OF SEQ``
is historically correct (capability ``historical_search``).

Grounding fields (documented in docs/kip.md): Concepts — name, key, and for a
capsule its title, statement, kind, context scope and tags; Propositions — the
predicate name and the subject and object names; Assertions — stance, the
predicate name and, for an assessment, its verdict and summary; Evidence — event
hash and type and the event's title, statement, summary, reason, verdict, kind
and basis.

``retrieval.score`` is the fraction of distinct query terms an element matches,
in [0, 1]; it is computed per query and never stored (§66.4).
"""

from __future__ import annotations

from akrelay.jsontypes import JSONObject
from akrelay.kip import budget as _budget
from akrelay.kip.elements import Assertion, Concept, Evidence, Proposition
from akrelay.kip.errors import KipError
from akrelay.kip.nexus import NexusBase, tokens

SCORE_SEMANTICS = "matched_query_term_fraction"


def search(nexus: NexusBase, kind: str, term: str, seq: int, *, type_filter: str | None = None,
           predicate_filter: str | None = None, threshold: float | None = None) -> list[tuple[float, str]]:
    """All hits ``(score, id)`` at ``seq``, best first, ties in creation order."""
    return top(nexus, kind, term, seq, type_filter=type_filter, predicate_filter=predicate_filter,
               threshold=threshold)[0]


def top(nexus: NexusBase, kind: str, term: str, seq: int, *, type_filter: str | None = None,
        predicate_filter: str | None = None, threshold: float | None = None, skip: int = 0,
        count: int | None = None) -> tuple[list[tuple[float, str]], bool]:
    """Hits ``skip .. skip+count`` in rank order, and whether more follow.

    Candidates come bucketed by how many query terms they match (``term_buckets``),
    and only the buckets needed for the page are read and filtered, so a page costs
    little more than the candidates it looks at.
    """
    query = tokens(term)
    if not query:
        raise KipError("ConstraintViolation", "the SEARCH term has no searchable words")
    tick = _budget.current().tick
    wanted = None if count is None else skip + count + 1
    hits: list[tuple[float, str]] = []
    for matched, ordinals in nexus.term_buckets(kind, query, seq):
        score = round(matched / len(query), 6)
        if threshold is not None and score < threshold:
            break
        for ordinal in ordinals:
            tick()
            element = nexus.at_ordinal(ordinal)
            eid = element.id
            if nexus.withheld is not None and nexus.hidden(element):
                continue
            if type_filter is not None or predicate_filter is not None:
                if type_filter is not None and (not isinstance(element, Concept) or element.type != type_filter):
                    continue
                if predicate_filter is not None:
                    prop = element if isinstance(element, Proposition) else nexus.get(element.proposition)  # type: ignore[union-attr]
                    if prop.predicate != predicate_filter:  # type: ignore[union-attr]
                        continue
            hits.append((score, eid))
            if wanted is not None and len(hits) >= wanted:
                return hits[skip: skip + count], True  # type: ignore[operator]
    if count is None:
        return hits[skip:], False
    return hits[skip: skip + count], False


def hit(nexus: NexusBase, eid: str, score: float) -> JSONObject:
    """One §66.4 hit: exact id, kind, schema identity, a safe snippet, retrieval info."""
    element = nexus.get(eid)
    out: JSONObject = {"id": eid}
    if isinstance(element, Concept):
        out.update(kind="concept", schema_ref=element.schema_ref, key=element.key, name=element.name, aliases=[],
                   snippet=_clip(element.attributes.get("statement") or element.name))
    elif isinstance(element, Proposition):
        subject = nexus.get(element.subject)
        out.update(kind="proposition", predicate_ref=element.predicate_ref,
                   snippet=_clip(f"({subject.name}, {element.predicate}, {_name(nexus, element.object)})"))  # type: ignore[union-attr]
    elif isinstance(element, Assertion):
        prop = nexus.get(element.proposition)
        facet = next(iter(element.facets.values()), {})
        out.update(kind="assertion", predicate_ref=prop.predicate_ref, stance=element.stance,  # type: ignore[union-attr]
                   asserted_by={"id": element.asserted_by},
                   snippet=_clip(facet.get("summary") or f"{element.stance} by {element.actor}"))
    elif isinstance(element, Evidence):
        payload = element.envelope["event"]["payload"]
        out.update(kind="evidence", evidence_class=element.evidence_class,
                   snippet=_clip(payload.get("title") or payload.get("summary") or payload.get("reason") or ""))
    out["retrieval"] = {"score": score, "mode": "keyword"}
    return out


def _name(nexus: NexusBase, obj: object) -> str:
    if isinstance(obj, dict):
        element = nexus.get(obj["id"])
        return element.name if isinstance(element, Concept) else str(obj["id"])
    return str(obj).lower() if isinstance(obj, bool) else str(obj)


def _clip(text: object, size: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= size else text[: size - 1] + "…"
