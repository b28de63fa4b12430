"""How text becomes index terms, chosen so that BM25 candidates never miss a ``q`` match.

§9.3.1 matches a term as a literal substring of one ASCII-folded field, in any
script (Chinese has no word boundaries, ``cache*`` keeps its asterisk). A word
tokenizer would lose such matches, so the index keeps every character trigram
of the folded search text instead:

* a term of three or more characters occurs in a field only if each of its
  trigrams occurs in the document, so the conjunction of those trigrams is a
  superset of the true matches;
* a term of one or two characters is a prefix of some trigram, because the
  indexed text is padded with two newlines (a newline never occurs inside a
  term), so "any trigram starting with the term" is again a superset.

The superset is then verified with the core's exact predicate, so hits are
exact and the candidate set provably contains every match. Folding is done
here with the core's :func:`~akrelay.protocol.text.search_text`, never by a
Tantivy filter, so that query and index fold identically.
"""

from __future__ import annotations

import hashlib
import json
import re

from tantivy import Index, TextAnalyzer, TextAnalyzerBuilder, Tokenizer

from akrelay.jsontypes import JSON, JSONMapping
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.text import eligible_fields

#: The custom analyzer name stored in the schema. Tantivy does not persist
#: analyzers, so :func:`register_analyzers` must run after every open.
GRAM_ANALYZER = "akrelay_trigram"
GRAM = 3
_PAD = "\n" * (GRAM - 1)

#: Everything that shapes ranking or candidate generation. The ranking id and
#: the index directory are derived from it, so a change gives a new id and a
#: rebuilt index instead of silently mixing two configurations.
RANKING_CONFIG: dict[str, JSON] = {
    "model": "bm25",
    "k1": 1.2,
    "b": 0.75,
    "terms": "char-trigrams of ASCII-folded eligible fields",
    "query": "trigram cover of each term (every third trigram and the last)",
    "short_terms": "trigram prefix, constant score",
    "tie_break": "seq ascending",
    "verification": "protocol.text.text_matches + protocol.query.query_matches",
    "schema": 1,
}


def ranking_id(config: JSONMapping) -> str:
    """A service-scoped id naming ``config``: equal configs, equal ids; any change, a new id."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return f"akrelay-lexical-bm25-trigram-{digest}"


RANKING_ID = ranking_id(RANKING_CONFIG)


def gram_analyzer() -> TextAnalyzer:
    """Trigrams over the raw (already folded) text; no lowercasing or stemming."""
    return TextAnalyzerBuilder(Tokenizer.ngram(min_gram=GRAM, max_gram=GRAM, prefix_only=False)).build()


def register_analyzers(index: Index) -> None:
    """Register the custom analyzer on a freshly opened index (required after every open)."""
    index.register_tokenizer(GRAM_ANALYZER, gram_analyzer())


#: ASCII ``A``-``Z`` to ``a``-``z`` on UTF-8 bytes: those bytes never occur inside
#: a multi-byte sequence, so this is exactly the core's ``ascii_fold``, in C.
_FOLD_BYTES = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")


def fold(text: str) -> str:
    """:func:`akrelay.protocol.text.ascii_fold`, faster on long non-ASCII text."""
    return text.encode("utf-8", "surrogatepass").translate(_FOLD_BYTES).decode("utf-8", "surrogatepass")


def indexed_text(envelope: Envelope) -> str:
    """The text handed to the trigram analyzer: the core's search text plus padding.

    Equal to ``search_text(envelope)`` (folded eligible fields joined by
    newlines; the property tests hold it to that), folded once for speed.
    """
    return fold("\n".join(eligible_fields(envelope))) + _PAD


def term_grams(term: str) -> list[str]:
    """Trigrams that every occurrence of a (folded) term of length >= 3 implies.

    A cover, not all of them: the trigrams at 0, 3, 6, ... and the last one.
    Any subset keeps the candidates a superset of the matches; fewer clauses
    make a conjunction of common words markedly cheaper to score.
    """
    starts = list(range(0, len(term) - GRAM + 1, GRAM))
    if starts[-1] != len(term) - GRAM:
        starts.append(len(term) - GRAM)
    return list(dict.fromkeys(term[i : i + GRAM] for i in starts))


def is_short(term: str) -> bool:
    return len(term) < GRAM


def prefix_pattern(term: str) -> str:
    """A Tantivy regex matching every trigram that starts with a short term.

    ``(?s)`` lets ``.`` match the newline padding. ``re.escape`` escapes exactly
    the metacharacters Rust's regex syntax also accepts escaped.
    """
    return "(?s)" + re.escape(term) + "." * (GRAM - len(term))
