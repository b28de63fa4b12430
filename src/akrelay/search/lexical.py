"""Lexical ranked search: BM25 candidates from Tantivy, every hit verified exactly.

Tantivy only proposes; the core decides. Candidates come from a trigram query
that is a provable superset of the §9.3.1 matches (see
:mod:`akrelay.search.analysis`) restricted by the same index facts the store
filters on, in descending BM25 order. Each candidate is then re-read from the
store and kept only if it is retained, visible, at or below the checkpoint and
passes :func:`~akrelay.protocol.query.query_matches` and
:func:`~akrelay.protocol.text.text_matches`. Coverage is exhaustive only when
every candidate was verified, at most ``limit`` matched and the index had
caught up to the checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from tantivy import DocAddress, FieldType, Occur, Order, Query, Searcher

from akrelay.protocol.envelope import Envelope
from akrelay.protocol.payload import PUBLISH, RETRACT
from akrelay.protocol.query import request_terms
from akrelay.protocol.query import query_matches
from akrelay.protocol.reads import SearchRequest
from akrelay.protocol.text import eligible_fields, text_matches
from akrelay.search.analysis import fold, is_short, prefix_pattern, term_grams
from akrelay.search.index import SCHEMA
from akrelay.search.results import SearchHit
from akrelay.store.base import Record, Store, term_key


@dataclass(frozen=True, slots=True)
class Budget:
    """How much verification one request may spend before reporting partial coverage."""

    #: Candidates verified at most (beyond it: ``candidate_limit``).
    candidates: int = 1000
    #: Wall time in seconds for candidate verification (beyond it: ``timeout``).
    seconds: float = 0.5


@dataclass(frozen=True, slots=True)
class LexicalResult:
    hits: list[SearchHit]
    #: Every candidate was verified and no more than ``limit`` matched.
    complete: bool
    timed_out: bool
    candidates: int


#: A short term whose trigram prefix expands to more index terms than this is
#: left to verification when a longer term drives the query (a common letter
#: would cost a union over thousands of postings and select nothing).
MAX_PREFIX_EXPANSION = 256


def build_query(request: SearchRequest, checkpoint: int | None, searcher: Searcher | None = None) -> Query:
    """The candidate query: trigram conjunction (BM25) AND exact facts AND time range.

    Terms shorter than a trigram add a (constant-score) prefix clause when no
    longer term drives the query, or when their prefix is selective (a Chinese
    bigram, say); otherwise verification alone enforces them. Leaving a clause
    out only widens the candidates, so no match can be lost.
    """
    clauses: list[tuple[Occur, Query]] = []
    grams: dict[str, None] = {}
    short = []
    for term in request.terms:
        if is_short(term):
            short.append(term)
        else:
            grams.update(dict.fromkeys(term_grams(term)))
    for gram in grams:
        clauses.append((Occur.Must, Query.term_query(SCHEMA, "grams", gram)))
    for term in short:
        if grams and (searcher is None or
                      len(searcher.terms_with_prefix("grams", term, limit=MAX_PREFIX_EXPANSION + 1))
                      > MAX_PREFIX_EXPANSION):
            continue
        clauses.append((Occur.Must, Query.regex_query(SCHEMA, "grams", prefix_pattern(term))))
    filters = request.filters
    for fact in request_terms(filters):
        clauses.append((Occur.Must, Query.const_score_query(Query.term_query(SCHEMA, "facts", term_key(fact)), 0.0)))
    if filters.created_from is not None or filters.created_before is not None:
        clauses.append((Occur.Must, Query.const_score_query(Query.range_query(
            SCHEMA, "created_at", FieldType.Integer, filters.created_from, filters.created_before,
            include_upper=False if filters.created_before is not None else True), 0.0)))
    if checkpoint is not None:
        clauses.append((Occur.Must, Query.const_score_query(
            Query.range_query(SCHEMA, "seq", FieldType.Integer, 1, checkpoint), 0.0)))
    return Query.boolean_query(clauses)


def quick_text_match(envelope: Envelope, terms: tuple[str, ...]) -> bool:
    """``text_matches`` with a faster fold (same result; see ``analysis.fold``)."""
    haystack = fold("\n".join(eligible_fields(envelope)))
    return all(term in haystack for term in terms)


def field_names(envelope: Envelope) -> list[str]:
    """Names for :func:`eligible_fields`, in the same order, for explanations."""
    event = envelope.event
    payload = event["payload"]
    if event["type"] == RETRACT:
        return ["reason"]
    names = ["title", "statement", "basis"] if event["type"] == PUBLISH else ["summary", "basis"]
    context = payload["context"]
    names.append("context.scope")
    names.extend(f"context.conditions[{i}]" for i in range(len(context["conditions"])))
    names.extend(f"context.limitations[{i}]" for i in range(len(context["limitations"])))
    return names


def explain(envelope: Envelope, terms: tuple[str, ...], score: float, *, max_chars: int = 300) -> str:
    """Which terms matched which fields, and the BM25 score; unsigned service metadata."""
    values = [fold(v) for v in eligible_fields(envelope)]
    names = field_names(envelope)
    if len(names) != len(values):
        names = [f"field {i}" for i in range(len(values))]
    parts = []
    for term in terms:
        where = [name for name, value in zip(names, values) if term in value]
        parts.append(f"{term!r} in {', '.join(where[:4])}{' …' if len(where) > 4 else ''}")
    text = f"BM25 {score:.3f}: " + "; ".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def lexical_search(
    request: SearchRequest,
    searcher: Searcher,
    store: Store,
    checkpoint: int,
    index_seq: int,
    *,
    budget: Budget = Budget(),
    clock: Callable[[], float] = time.monotonic,
) -> LexicalResult:
    """Rank and verify; see the module docstring for the guarantees."""
    limit = request.limit
    query = build_query(request, checkpoint if index_seq > checkpoint else None, searcher)
    # Only prefix clauses (every term shorter than a trigram): all scores are
    # equal, so candidates are read in seq order and the tie-break is the order.
    scored = any(not is_short(term) for term in request.terms)

    def fetch(size: int, offset: int, count: bool) -> tuple[int, list[tuple[float, DocAddress]]]:
        if scored:
            result = searcher.search(query, size, count=count, offset=offset)
        else:
            result = searcher.search(query, size, count=count, offset=offset, order_by_field="seq", order=Order.Asc)
        hits = result.hits if scored else [(0.0, address) for _, address in result.hits]
        total: int = result.count  # type: ignore[attr-defined]  # tantivy's stub omits SearchResult.count
        return total, hits

    deadline = clock() + budget.seconds
    first = min(budget.candidates, 2 * limit + 10)
    total, batch = fetch(first, 0, True)
    examined = 0
    verified: list[tuple[float, int, Record]] = []
    seen: set[str] = set()
    boundary: float | None = None  # the score of the limit-th hit, once found
    timed_out = False
    done = False
    while batch and not done:
        addresses = [address for _, address in batch]
        seqs = searcher.fast_field_values("seq", addresses)
        ids = [searcher.doc(address).get_first("id") for address in addresses]
        found = store.get_many([i for i in ids if i is not None])
        for (score, _), seq, event_id in zip(batch, seqs, ids):
            if len(verified) > limit and (not scored or (boundary is not None and score < boundary)):
                # More than a page matched, and every candidate tied with the
                # limit-th hit has been seen, so the seq tie-break is exact.
                done = True
                break
            examined += 1
            record = found.get(event_id) if event_id is not None else None
            if (record is None or record.withheld or record.seq != seq or record.seq > checkpoint
                    or record.envelope.id in seen):
                continue
            envelope = record.envelope
            # A fast, exactly equivalent pre-check discards false candidates;
            # every hit is still confirmed by the core's own predicates.
            if not quick_text_match(envelope, request.terms):
                continue
            if not query_matches(envelope, request.filters) or not text_matches(envelope, request.terms):
                continue
            seen.add(envelope.id)
            verified.append((score, record.seq, record))
            if len(verified) == limit:
                boundary = score
        if done or examined >= total:
            break
        if examined >= budget.candidates:
            break
        if clock() > deadline:
            timed_out = True
            break
        size = min(budget.candidates - examined, max(4 * len(batch), 100))
        _, batch = fetch(size, examined, False)
    complete = not timed_out and examined >= total and len(verified) <= limit
    verified.sort(key=lambda item: (-item[0], item[1]))
    hits = [SearchHit(record, score, explain(record.envelope, request.terms, score))
            for score, _, record in verified[:limit]]
    return LexicalResult(hits, complete, timed_out, total)
