"""Ranked retrieval for natural-language questions: BM25 with the words OR-ed.

The §9.5 lexical mode needs every term to match, which suits a ``q`` but not
a question ("what breaks the cache on restart?"). This mode keeps the same
index and the same folding, but:

* the question's words (Unicode word runs after the index's ASCII fold) lose
  their stop words and duplicates; at most :data:`MAX_QUESTION_TERMS` remain;
* each word becomes the conjunction of its trigram cover (as in lexical mode),
  and the words are joined with OR, so a record matching more or rarer words
  ranks higher (BM25 over the trigram postings);
* every candidate is re-read from the store and kept only if it is retained,
  not withheld, at or below the snapshot ``seq`` and really contains at least
  one of the words (trigram covers can collide);
* ties are broken by ``seq`` ascending, so one snapshot gives one order.

A question with no searchable word gives no hits, never an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from tantivy import FieldType, Occur, Query, Searcher

from akrelay.search.analysis import fold, term_grams
from akrelay.search.index import SCHEMA
from akrelay.store.base import Record, Store, term_key

#: More words than this add little to a question's ranking and cost a clause each.
MAX_QUESTION_TERMS = 16
#: Words shorter than a trigram cannot drive a BM25 clause; they are dropped.
MIN_TERM_CHARS = 3

_WORD = re.compile(r"\w+", re.UNICODE)

#: English function words and question words: frequent everywhere, so they would
#: rank by noise. Kept small and fixed (part of the mode's contract).
STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here
hers herself him himself his how however i if in into is it its itself just let me more most my myself no nor
not now of off on once only or other ought our ours ourselves out over own same she should so some such than
that the their theirs them themselves then there these they this those through to too under until up very was
we were what when where which while who whom why will with would you your yours yourself yourselves tell show
give find know please yes does did get got much many way ways
""".split())


def question_terms(text: str) -> tuple[str, ...]:
    """The searchable words of ``text``: folded as the index folds, stop words dropped, first 16."""
    words: dict[str, None] = {}
    for word in _WORD.findall(fold(text)):
        if len(word) < MIN_TERM_CHARS or word in STOP_WORDS:
            continue
        words.setdefault(word, None)
        if len(words) == MAX_QUESTION_TERMS:
            break
    return tuple(words)


@dataclass(frozen=True, slots=True)
class QuestionHit:
    record: Record
    score: float


def build_question_query(terms: Sequence[str], snapshot: int, types: Iterable[str] = ()) -> Query:
    """OR over the words (each the AND of its trigram cover), within ``seq <= snapshot`` and ``types``."""
    words = []
    for term in terms:
        grams = term_grams(term)
        clauses = [(Occur.Must, Query.term_query(SCHEMA, "grams", g)) for g in grams]
        words.append((Occur.Should, Query.boolean_query(clauses) if len(clauses) > 1 else clauses[0][1]))
    must: list[tuple[Occur, Query]] = [(Occur.Must, Query.boolean_query(words))]
    must.append((Occur.Must, Query.const_score_query(
        Query.range_query(SCHEMA, "seq", FieldType.Integer, 1, snapshot), 0.0)))
    kinds = [(Occur.Should, Query.term_query(SCHEMA, "facts", term_key(("type", t)))) for t in types]
    if kinds:
        must.append((Occur.Must, Query.const_score_query(Query.boolean_query(kinds), 0.0)))
    return Query.boolean_query(must)


def question_search(terms: Sequence[str], searcher: Searcher, store: Store, snapshot: int, limit: int, *,
                    types: Iterable[str] = (), candidates: int = 400) -> list[QuestionHit]:
    """The best ``limit`` verified hits for ``terms`` at ``snapshot``, best first.

    Candidates are read in BM25 order, in growing batches, until ``limit`` are
    verified or ``candidates`` were examined. Ties at the cut are broken by seq
    within what was read.
    """
    if not terms or limit < 1 or snapshot < 1:
        return []
    from akrelay.protocol.text import eligible_fields

    query = build_question_query(terms, snapshot, tuple(types))
    hits: list[tuple[float, int, Record]] = []
    seen: set[str] = set()
    examined = 0
    size = limit + 8  # verification rarely drops a candidate: fetch a little more than asked
    while examined < candidates:
        batch = searcher.search(query, min(size, candidates - examined), count=False, offset=examined).hits
        if not batch:
            break
        examined += len(batch)
        addresses = [address for _, address in batch]
        seqs = searcher.fast_field_values("seq", addresses)
        ids = [searcher.doc(address).get_first("id") for address in addresses]
        found = store.get_many([i for i in ids if i is not None])
        for (score, _), seq, event_id in zip(batch, seqs, ids):
            record = found.get(event_id) if event_id is not None else None
            if (event_id is None or record is None or record.withheld or record.seq != seq or record.seq > snapshot
                    or event_id in seen):
                continue
            haystack = fold("\n".join(eligible_fields(record.envelope)))
            if not any(term in haystack for term in terms):
                continue
            seen.add(event_id)
            hits.append((round(float(score), 6), record.seq, record))
        if len(hits) >= limit or len(batch) < size:
            break
        size = 2 * size
    hits.sort(key=lambda item: (-item[0], item[1]))
    return [QuestionHit(record, score) for score, _, record in hits[:limit]]
