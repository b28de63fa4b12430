"""Composition: the retrieval envelope (seed 000 §8.2) and the extractive composer.

The extractive composer needs no model and is deterministic: the same
retrieval gives the same text, citations and order. It answers first: the
capsules are ranked by how well they answer the ask (:mod:`.rank`), and the
first line is the best sentence of the best one, built for the question's
type (the unit-bearing number for "how long"/"how many", Yes/No/Unclear for a
yes/no question), with its ``[1]`` citation and its BELIEF qualifier. A
rejected best answer is reported as rejected, never stated as fact; a
contested or unconfirmed one says so up front. When nothing covers the ask,
the first line declines and nothing is cited.

The evidence follows, grouped by BELIEF status under the turn's policy:
accepted capsules are stated as findings; contested ones say how many
assessments support and reject them; uncertain and insufficient ones are
labelled unconfirmed; a rejected capsule is only ever reported as rejected.
Every line carries a ``[n]`` marker whose citation ``source`` is the event ID
it came from, and every citation lies in this turn's retrieved set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, cast

from akrelay.jsontypes import JSONObject
from akrelay.knowql import extract
from akrelay.knowql.answer_types import Artifact, Belief, Chunk, Fact
from akrelay.knowql.rank import EarlierTurn, Ranked, Ranking, rank
from akrelay.knowql.retrieval import Retrieval

EXTRACTIVE_MODEL = "akrelay/extractive-1"
#: Artifacts a composed answer uses at most (``max_retrieved`` lowers it).
COMPOSE_DEFAULT = 10
#: Items a retrieval-only turn returns by default, and per-item characters.
RETRIEVAL_DEFAULT = 20
CHARS_DEFAULT = 2000

_GROUPS = (
    ("accepted", "Findings (accepted):"),
    ("contested", "Contested:"),
    ("unconfirmed", "Unconfirmed:"),
    ("rejected", "Rejected by assessors (not established):"),
)
_COUNT_WORDS = ("No", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten")


@dataclass
class Composition:
    text: str
    deltas: list[str]
    citations: list[JSONObject]
    #: the composed artifacts (``source``, ``title``, ``text``, ``status``, ``score``, ``url``…), best first
    items: list[JSONObject] = field(default_factory=list)
    output_json: JSONObject | None = None
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})
    model: str = EXTRACTIVE_MODEL
    #: answering sentences, best first (the lead's first); never from a rejected capsule
    facts: list[Fact] = field(default_factory=list)
    question: extract.Question | None = None
    #: shape field -> {"citation", "source", "sentence", "belief"}: where each filled value came from
    provenance: dict[str, JSONObject] = field(default_factory=dict)


def _group(status: str) -> str:
    if status in ("accepted", "contested", "rejected"):
        return status
    return "unconfirmed"


def _clip(text: str, size: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= size else text[: size - 1] + "…"


def citation(artifact: Artifact) -> JSONObject:
    """A seed 000 citation (``source`` = the capsule's publish event ID) with akrelay members."""
    return {"source": artifact["source"], "kind": "capsule", "title": artifact["name"], "url": artifact["url"],
            "belief": artifact["belief"]["status"], "context": list(artifact["context"])}


def _assessments(n: int, what: str) -> str:
    return f"{n} {what} assessment{'s' if n != 1 else ''}"


def _why_unconfirmed(belief: Belief) -> str:
    if "uncorroborated" in belief.get("reasons", ()):
        return "only its author supports it"
    return str(belief["status"])


def _sentence(text: str) -> str:
    text = _clip(text, 300).rstrip()
    return text[:-1] if text.endswith((".", ";")) else text


def _lead(top: Ranked, ranking: Ranking, ask: str) -> tuple[str, Fact | None]:
    """The answer's first line (without its citation marker) and the fact it states, if any."""
    artifact, question = top.artifact, ranking.question
    belief = artifact["belief"]
    group = _group(belief["status"])
    supporting, rejecting = belief["supporting"], belief["rejecting"]
    best = top.best
    assert best is not None
    claim_negative = extract.negated(best.text) != extract.negated(ask)
    if group == "rejected":
        prefix = "No: " if question.kind == "yesno" and not claim_negative else "Not established: "
        line = (f"{prefix}{_who(rejecting)} rejected the claim \u201c{_clip(artifact['name'], 200)}\u201d "
                f"({rejecting} rejecting / {supporting} supporting); it is not stated as fact")
        return line, Fact("", 1, artifact["source"], belief["status"], None, False if prefix == "No: " else None,
                          note=line + " [1]")
    sentence = _sentence(best.text)
    fact = Fact(best.text, 1, artifact["source"], belief["status"])
    yesno = question.kind == "yesno"
    if not _stated(belief):
        # Only the author stands behind it: report the rejection, do not state the claim.
        fact.sentence = ""
        return (f"{'Unclear: ' if yesno else ''}Contested: {_who(rejecting)} rejected the claim "
                f"\u201c{_clip(artifact['name'], 200)}\u201d and no assessor supports it "
                f"(0 supporting / {rejecting} rejecting assessments); not stated as fact"), fact
    body = sentence
    if question.kind in ("duration", "count", "quantity"):
        fact.quantity = extract.answer_quantity(best.text, question)
        if fact.quantity is not None:
            shown = fact.quantity.text
            if fact.quantity.unit is None and fact.quantity.noun is not None and not question.counts(
                    fact.quantity.noun):
                shown = shown.split()[0]  # "three synchronous replicas": the number, not the adjective
            body = f"{shown}: {sentence}"
    if group == "accepted":
        if yesno:
            fact.yes = not claim_negative
            body = f"{'No' if claim_negative else 'Yes'}: {sentence}"
        qualifier = f" (accepted; {_assessments(supporting, 'supporting')})" if supporting else " (accepted)"
        return body + qualifier, fact
    head = "Unclear: " if yesno else ""
    if group == "contested":
        return (f"{head}Contested ({_assessments(supporting, 'supporting')}, {_assessments(rejecting, 'rejecting')}): "
                f"{body}"), fact
    return f"{head}Unconfirmed ({_why_unconfirmed(belief)}): {body}", fact


def _stated(belief: Belief) -> bool:
    """Whether a capsule's statement may be given as an answer: not rejected, and not contested by
    assessors with only its author behind it."""
    group = _group(belief["status"])
    return group != "rejected" and not (group == "contested" and not belief["supporting"] and belief["rejecting"])


def _who(n: int) -> str:
    """"two assessors", "one assessor", "assessors"."""
    if not n:
        return "assessors"
    word = _COUNT_WORDS[n].lower() if n < len(_COUNT_WORDS) else str(n)
    return f"{word} assessor{'s' if n != 1 else ''}"


def _facts(ranked: Sequence[Ranked], question: extract.Question, lead: Fact | None) -> list[Fact]:
    """The lead's fact, then the other answering sentences of the cited capsules (those whose statement may
    be given as an answer)."""
    out = [lead] if lead is not None and (lead.sentence or lead.yes is not None) else []
    for n, entry in enumerate(ranked, start=1):
        if not _stated(entry.artifact["belief"]):
            continue
        for sentence in entry.sentences:
            if lead is not None and n == 1 and sentence.text == lead.sentence:
                continue
            if sentence.score <= 0:
                continue
            out.append(Fact(sentence.text, n, entry.artifact["source"], entry.artifact["belief"]["status"],
                            extract.answer_quantity(sentence.text, question)))
    return out


def extractive(ask: str, retrieval: Retrieval, limit: int = COMPOSE_DEFAULT,
               history: Sequence[EarlierTurn] = ()) -> Composition:
    artifacts = retrieval.artifacts[:limit]
    if not artifacts:
        text = (f"No knowledge in scope matched this question (snapshot seq {retrieval.snapshot_seq})."
                if retrieval.keyword_query else
                "The question has no searchable words, so nothing was retrieved.")
        return Composition(text, [text], [])
    ranking = rank(ask, history, artifacts, retrieval.details, retrieval.previous)
    if not ranking.answered or not ranking.ranked:
        text = (f"Nothing in scope answers this question (snapshot seq {retrieval.snapshot_seq}): "
                f"{len(artifacts)} capsule(s) share some of its words, but none says what it asks.")
        return Composition(text, [text], [], question=ranking.question)
    ranked = ranking.ranked
    citations = [citation(r.artifact) for r in ranked]
    number = {r.artifact["source"]: n for n, r in enumerate(ranked, start=1)}
    lead, fact = _lead(ranked[0], ranking, ask)
    lines = [f"{lead} [1]", "", f"From {len(ranked)} capsule(s) at snapshot seq {retrieval.snapshot_seq}, "
                                f"beliefs under {retrieval.policy}:"]
    grouped: dict[str, list[Ranked]] = {g: [] for g, _ in _GROUPS}
    for entry in ranked:
        grouped[_group(entry.artifact["belief"]["status"])].append(entry)
    for group, heading in _GROUPS:
        if not grouped[group]:
            continue
        lines.append("")
        lines.append(heading)
        for entry in grouped[group]:
            artifact = entry.artifact
            n = number[artifact["source"]]
            belief = artifact["belief"]
            title, statement = _clip(artifact["name"], 200), _clip(artifact["text"])
            if group == "accepted":
                line = f"- {title}: {statement} [{n}]"
            elif group == "contested":
                line = (f"- {title} (contested: {belief['supporting']} supporting / {belief['rejecting']} "
                        f"rejecting assessments): {statement} [{n}]")
            elif group == "unconfirmed":
                why = "uncorroborated" if "uncorroborated" in belief.get("reasons", ()) else belief["status"]
                line = f"- {title} (unconfirmed, {why}): {statement} [{n}]"
            else:
                line = (f"- {title} (rejected: {belief['rejecting']} rejecting / {belief['supporting']} "
                        f"supporting assessments; not stated as fact) [{n}]")
            lines.append(line)
    items: list[JSONObject] = [{"source": r.artifact["source"], "id": r.artifact["id"], "title": r.artifact["name"],
              "text": r.artifact["text"], "kind": r.artifact["kind"], "status": r.artifact["belief"]["status"],
              "score": r.artifact["score"], "url": r.artifact["url"]} for r in ranked]
    text = "\n".join(lines)
    deltas = [line + "\n" for line in lines]
    deltas[-1] = deltas[-1].rstrip("\n")
    return Composition(text, deltas, citations, items, facts=_facts(ranked, ranking.question, fact),
                       question=ranking.question)


def envelope(retrieval: Retrieval, mode: str, kind: str, *, max_items: int | None, max_chars: int | None,
             pointers: bool) -> JSONObject:
    """The seed 000 §8.2 retrieval envelope; ``max_items`` caps chunks and artifacts together."""
    cap = max_items or RETRIEVAL_DEFAULT
    chars = max_chars or CHARS_DEFAULT
    chunks = retrieval.chunks if kind in ("chunks", "both") else []
    artifacts = retrieval.artifacts if kind in ("artifacts", "both") else []
    # Both lists in one ranking (artifacts first on a tie), cut to the cap.
    order = sorted([(-a["score"], 0, i, "a") for i, a in enumerate(artifacts)] +
                   [(-c["score"], 1, i, "c") for i, c in enumerate(chunks)])[:cap]
    keep_a = sorted(i for *_, i, which in order if which == "a")
    keep_c = sorted(i for *_, i, which in order if which == "c")
    out_artifacts = [_item(artifacts[i], chars, pointers) for i in keep_a]
    out_chunks = [_item(chunks[i], chars, pointers) for i in keep_c]
    doc: dict[str, object] = {
        "answered_by": "retrieval",
        "mode": mode,
        "counts": {"chunks": len(out_chunks), "artifacts": len(out_artifacts)},
        "chunks": out_chunks,
        "artifacts": out_artifacts,
        "retrieval": {"query_variants": list(retrieval.query_variants), "keyword_query": retrieval.keyword_query,
                      "matched_artifacts": [a["id"] for a in out_artifacts], "entry_level": None,
                      "expand_window": 0},
    }
    # The artifacts and chunks are JSON objects (TypedDicts to the code that reads them): the envelope copies them.
    return cast(JSONObject, doc)


def _item(item: Artifact | Chunk, chars: int, pointers: bool) -> dict[str, object]:
    out: dict[str, object] = {k: v for k, v in item.items() if k != "text"}
    if not pointers:
        text = item["text"]
        out["text"] = text[:chars]
        out["truncated"] = len(text) > chars
    return out


class ComposerTurn(Protocol):
    """What the extractive composer reads of a turn (``akrelay.knowql.models.TurnInput``, which imports this)."""

    @property
    def ask(self) -> str: ...

    @property
    def history(self) -> Sequence[EarlierTurn]: ...

    @property
    def shape(self) -> JSONObject | None: ...


class ExtractiveComposer:
    """The default composer (:func:`extractive`), binding ``shape`` with :func:`akrelay.knowql.shape.bind`."""

    def compose(self, turn: ComposerTurn, retrieval: Retrieval, emit: Callable[[str], None]) -> Composition:
        from akrelay.knowql.shape import bind

        composition = extractive(turn.ask, retrieval, history=turn.history)
        if turn.shape is not None:
            composition.output_json = bind(turn.shape, composition.text, composition.items, composition.citations,
                                           facts=composition.facts, question=composition.question,
                                           provenance=composition.provenance)
        for delta in composition.deltas:
            emit(delta)
        return composition
