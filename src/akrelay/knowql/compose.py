"""Composition: the retrieval envelope (seed 000 §8.2) and the extractive composer.

The extractive composer needs no model and is deterministic: the same
retrieval gives the same text, citations and order. It groups the retrieved
capsules by BELIEF status under the turn's policy: accepted capsules are
stated as findings; contested ones say how many assessments support and
reject them; uncertain and insufficient ones are labelled unconfirmed; a
rejected capsule is only ever reported as rejected, never stated as fact.
Every line carries a ``[n]`` marker whose citation ``source`` is the event ID
it came from, and every citation lies in this turn's retrieved set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class Composition:
    text: str
    deltas: list[str]
    citations: list[dict[str, Any]]
    items: list[dict[str, Any]] = field(default_factory=list)
    output_json: Any = None
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})
    model: str = EXTRACTIVE_MODEL


def _group(status: str) -> str:
    if status in ("accepted", "contested", "rejected"):
        return status
    return "unconfirmed"


def _clip(text: str, size: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= size else text[: size - 1] + "…"


def citation(artifact: dict[str, Any]) -> dict[str, Any]:
    """A seed 000 citation (``source`` = the capsule's publish event ID) with akrelay members."""
    return {"source": artifact["source"], "kind": "capsule", "title": artifact["name"], "url": artifact["url"],
            "belief": artifact["belief"]["status"], "context": artifact["context"]}


def extractive(ask: str, retrieval: Retrieval, limit: int = COMPOSE_DEFAULT) -> Composition:
    artifacts = retrieval.artifacts[:limit]
    if not artifacts:
        text = (f"No knowledge in scope matched this question (snapshot seq {retrieval.snapshot_seq})."
                if retrieval.keyword_query else
                "The question has no searchable words, so nothing was retrieved.")
        return Composition(text, [text], [])
    grouped: dict[str, list[dict[str, Any]]] = {g: [] for g, _ in _GROUPS}
    for artifact in artifacts:
        grouped[_group(artifact["belief"]["status"])].append(artifact)
    citations: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    lines = [f"From {len(artifacts)} capsule(s) at snapshot seq {retrieval.snapshot_seq}, "
             f"beliefs under {retrieval.policy}:"]
    for group, heading in _GROUPS:
        if not grouped[group]:
            continue
        lines.append("")
        lines.append(heading)
        for artifact in grouped[group]:
            citations.append(citation(artifact))
            n = len(citations)
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
            items.append({"source": artifact["source"], "id": artifact["id"], "title": artifact["name"],
                          "text": artifact["text"], "kind": artifact["kind"], "status": belief["status"],
                          "score": artifact["score"], "url": artifact["url"]})
    text = "\n".join(lines)
    deltas = [line + "\n" for line in lines]
    deltas[-1] = deltas[-1].rstrip("\n")
    return Composition(text, deltas, citations, items)


def envelope(retrieval: Retrieval, mode: str, kind: str, *, max_items: int | None, max_chars: int | None,
             pointers: bool) -> dict[str, Any]:
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
    return {
        "answered_by": "retrieval",
        "mode": mode,
        "counts": {"chunks": len(out_chunks), "artifacts": len(out_artifacts)},
        "chunks": out_chunks,
        "artifacts": out_artifacts,
        "retrieval": {"query_variants": list(retrieval.query_variants), "keyword_query": retrieval.keyword_query,
                      "matched_artifacts": [a["id"] for a in out_artifacts], "entry_level": None,
                      "expand_window": 0},
    }


def _item(item: dict[str, Any], chars: int, pointers: bool) -> dict[str, Any]:
    out = {k: v for k, v in item.items() if k != "text"}
    if not pointers:
        text = item["text"]
        out["text"] = text[:chars]
        out["truncated"] = len(text) > chars
    return out


class ExtractiveComposer:
    """The default composer (:func:`extractive`), binding ``shape`` with :func:`akrelay.knowql.shape.bind`."""

    def compose(self, turn: Any, retrieval: Retrieval, emit: Any) -> Composition:
        from akrelay.knowql.shape import bind

        composition = extractive(turn.ask, retrieval)
        if turn.shape is not None:
            composition.output_json = bind(turn.shape, composition.text, composition.items, composition.citations)
        for delta in composition.deltas:
            emit(delta)
        return composition
