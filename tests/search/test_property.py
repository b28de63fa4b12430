"""Property: lexical search agrees with the exact query endpoint on random corpora and texts.

Hits are always a subset of the ``q`` matches; when coverage says
``exhaustive`` they are exactly the matches. On these small corpora the
candidate budget is never reached, so the search must also *be* exhaustive
whenever the matches fit in one page: that is what proves the trigram
candidates never miss a literal-substring match.
"""

from __future__ import annotations

import json

from search_corpus import T0, assessment, publication, retraction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akrelay.protocol.query import QueryRequest, query_matches
from akrelay.protocol.text import distinct_terms, text_matches
from akrelay.search import SearchEngine
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.store.memory import MemoryStore

# Pieces chosen to collide: ASCII in both cases, Chinese, punctuation, a
# literal asterisk, non-ASCII letters that must not fold, an emoji, NBSP.
PIECES = ["a", "A", "b", "ab", "AB", "cache", "CACHE", "cache*", "*", "-", ".", "语", "言", "语言", "知识",
          "ä", "Ä", "é", "ζ", "😀", "\u00a0", "x", "xy", "lan", "guage", ":", "（", "）", "_"]
WORD = st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map("".join)
FIELD = st.lists(WORD, min_size=1, max_size=5).map(" ".join)
TERM = st.one_of(WORD, st.sampled_from(PIECES)).filter(lambda t: t.strip("\t\n\x0b\x0c\r ") == t)

capsule = st.fixed_dictionaries({
    "type": st.sampled_from(["publish", "publish", "publish", "assess", "retract"]),
    "title": FIELD, "statement": FIELD, "basis": FIELD, "scope": FIELD,
    "conditions": st.lists(FIELD, max_size=2, unique=True),
    "kind": st.sampled_from(["observation", "hypothesis"]),
    "language": st.sampled_from(["en", "EN", "zh", "en-US"]),
    "tags": st.lists(st.sampled_from(["t1", "t2"]), max_size=2, unique=True),
    "created_at": st.integers(T0, T0 + 5),
    "withheld": st.booleans(),
})
filters = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["knowledge.publish", "knowledge.assess", "knowledge.retract"]),
    "kind": st.sampled_from(["observation", "hypothesis"]),
    "language": st.sampled_from(["en", "zh"]),
    "tag": st.sampled_from(["t1", "t2"]),
    "created_from": st.integers(T0, T0 + 3),
})


def _build(specs):
    envelopes, withheld = [], []
    first = None
    for i, spec in enumerate(specs):
        if spec["type"] == "publish" or first is None:
            envelope = publication(spec["title"], spec["statement"], spec["basis"], scope=spec["scope"],
                                   conditions=spec["conditions"], kind=spec["kind"], language=spec["language"],
                                   tags=spec["tags"], created_at=spec["created_at"], nonce=i + 1, signer=0)
            first = first or envelope
        elif spec["type"] == "assess":
            envelope = assessment(first.id, spec["title"], spec["basis"], scope=spec["scope"], signer=1,
                                  created_at=spec["created_at"], nonce=i + 1)
        else:
            envelope = retraction(first.id, spec["title"], signer=0, created_at=spec["created_at"] + 10,
                                  nonce=1000 + i)
        envelopes.append(envelope)
        withheld.append(spec["withheld"])
    return envelopes, withheld


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(capsule, min_size=1, max_size=12), terms=st.lists(TERM, min_size=1, max_size=3),
       picked=st.lists(st.integers(0, 10_000), max_size=2), chosen=filters, limit=st.integers(1, 8))
def test_lexical_search_agrees_with_exact_query(specs, terms, picked, chosen, limit):
    envelopes, withheld = _build(specs)
    store = MemoryStore()
    relay = Relay(store, RelayConfig(origin="https://knowledge.example.com"), clock=lambda: T0,
                  cursor_secret=b"k" * 32)
    for envelope, hide in zip(envelopes, withheld):
        record, created = store.commit(envelope, T0)
        if created and hide:
            store.set_withheld(envelope.id, True)
    # Also search for substrings that certainly occur, cut at random places.
    texts = " ".join(terms)
    for n in picked:
        source = "".join(specs[n % len(specs)]["statement"].split())
        if source:
            start = n % len(source)
            texts += " " + source[start:start + 1 + n % 4]
    text = " ".join(texts.split(" ")[:16])
    service = SearchEngine(relay, None)
    try:
        assert service.wait_indexed(timeout=60)
        body = {"text": text, "mode": "lexical", "filters": chosen, "limit": limit}
        page = json.loads(service.search(json.dumps(body).encode()).to_json())
    finally:
        service.close()

    # The exact query endpoint, all pages, with the same text and filters.
    pairs = [("q", text), ("limit", "1000")] + [(k, str(v)) for k, v in chosen.items()]
    exact_page = relay.query(pairs)
    assert exact_page.next_cursor is None
    exact = [r.envelope.id for r in exact_page.records]
    # ... and a brute-force statement of §9.3.1 over the visible corpus.
    request = QueryRequest(**chosen)
    brute = {e.id for e, hide in zip(envelopes, withheld) if not hide and query_matches(e, request)
             and text_matches(e, distinct_terms(text))}
    assert set(exact) == brute

    hits = [hit["record"]["envelope"]["hash"] for hit in page["result"]]
    assert len(hits) == len(set(hits)) <= limit
    assert set(hits) <= set(exact)
    if page["coverage"]["exhaustive"]:
        assert set(hits) == set(exact)
    # Small corpora: nothing is left unverified, so coverage is exact about itself.
    assert page["coverage"]["exhaustive"] == (len(exact) <= limit)
    if len(exact) > limit:
        assert page["coverage"]["reasons"] == ["candidate_limit"] and len(hits) == limit
