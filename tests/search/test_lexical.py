"""Lexical search is exact (§9.3.1 semantics) and its coverage is honest (§9.5)."""

from __future__ import annotations

import json

import pytest
from agent_protocols.knowledge import validate_knowledge_search_response
from search_corpus import ORIGIN, T0, assessment, publication, retraction

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.reads import parse_search_request
from akrelay.protocol.records import validate_search_response
from akrelay.protocol.text import distinct_terms, text_matches
from akrelay.search import RANKING_ID, Budget
from akrelay.search.analysis import RANKING_CONFIG, ranking_id


def _service(env, envelopes, **kw):
    relay = env.memory_relay()
    for envelope in envelopes:
        relay.store.commit(envelope, T0)
    service = env.service(relay, None, **kw)
    assert service.wait_indexed(timeout=60)
    return relay, service


def _search(service, text, **body):
    request = {"text": text, "mode": "lexical", **body}
    page = service.search(json.dumps(request, ensure_ascii=False).encode())
    wire = json.loads(page.to_json())
    assert wire == json.loads(json.dumps(page.to_dict()))
    # The page passes both our client-side checks and the reference SDK's.
    validate_search_response(wire, parse_search_request(request, ("lexical",)), ORIGIN)
    validate_knowledge_search_response(wire, request, ORIGIN)
    return wire


def _ids(wire):
    return [hit["record"]["envelope"]["hash"] for hit in wire["result"]]


def _exact(relay, text):
    """The exact query endpoint's answer for ``q=text`` (every page)."""
    page = relay.query([("q", text), ("limit", "1000")])
    return {r.envelope.id for r in page.records}


CORPUS = [
    publication("ALPHA cache* Ä café 😀", "语言知识 beta a b boundary-left", "boundary-right",
                scope="delta", conditions=["epsilon", "join"], limitations=["piece", "ζ"]),
    publication("Caching strategies", "LRU caches evict the least recently used entry.", "benchmarks",
                tags=["cache"]),
    publication("大语言模型的缓存", "中文文本：语言模型（LLM）需要缓存。", "实验", language="zh", nonce=2),
    publication("punctuation: a.b-c_d/e", "x+y=z? (maybe) [yes] {no} ^$|\\ #&~", "path/to/file.txt", nonce=3),
]


@pytest.mark.parametrize("text", [
    "语言", "语", "言知", "中文文本：", "（LLM）", "缓存", "大语言模型的缓存",
    "cache*", "cache", "CACHE", "CaChE*", "*", "a", "b", "ab", "ä", "Ä", "é", "café", "CAFÉ", "😀", "ζ",
    "a.b-c_d/e", ".", "-", "^$|\\", "#&~", "{no}", "[yes]", "(maybe)", "x+y=z?", "file.txt",
    "boundary-left", "boundary-right", "deltaepsilon", "epsilon", "EPSILON join", "beta boundary",
    "lru least", "zzz", "alpha zzz", "a b", "e", "s",
])
def test_hits_equal_exact_matches(env, text):
    relay, service = _service(env, CORPUS)
    wire = _search(service, text, limit=100)
    expected = _exact(relay, text)
    assert set(_ids(wire)) == expected
    assert wire["coverage"] == {"exhaustive": True, "reasons": []}
    assert wire["index_seq"] == wire["checkpoint"] == len(CORPUS)
    terms = distinct_terms(text)
    by_id = {e.id: e for e in CORPUS}
    for event_id in _ids(wire):
        assert text_matches(by_id[event_id], terms)


def test_literal_semantics_no_unicode_folding_or_spanning(env):
    relay, service = _service(env, CORPUS)
    assert _ids(_search(service, "Ä")) == [CORPUS[0].id]
    assert _ids(_search(service, "ä")) == []  # only ASCII folds
    assert _ids(_search(service, "deltaepsilon")) == []  # a term never spans two fields
    assert _ids(_search(service, "cache*")) == [CORPUS[0].id]  # the asterisk is literal
    assert set(_ids(_search(service, "cache"))) == {CORPUS[0].id, CORPUS[1].id}


def test_ranking_orders_by_score_then_seq_and_explains(env):
    same = [publication("gamma ray", f"filler {i}", nonce=10 + i) for i in range(6)]
    strong = publication("gamma gamma gamma", "gamma gamma", "gamma", nonce=30)
    relay, service = _service(env, same + [strong])
    wire = _search(service, "gamma", limit=4)
    ids = _ids(wire)
    assert ids[0] == strong.id  # more occurrences in a short document rank first
    seqs = [hit["record"]["seq"] for hit in wire["result"][1:]]
    assert seqs == sorted(seqs) == [1, 2, 3]  # equal scores: lowest seq first
    assert wire["coverage"] == {"exhaustive": False, "reasons": ["candidate_limit"]}
    explanation = wire["result"][0]["explanation"]
    assert "'gamma' in title, statement, basis" in explanation and "BM25" in explanation
    assert wire["ranking"] == {"mode": "lexical", "id": RANKING_ID}


def test_tie_break_is_deterministic_across_segments(env):
    relay = env.memory_relay()
    service = env.service(relay, None)
    docs = [publication("omega", "same", nonce=100 + i) for i in range(12)]
    for i, envelope in enumerate(docs):
        relay.store.commit(envelope, T0)
        if i % 3 == 2:  # several commits -> several segments
            assert service.wait_indexed(timeout=60)
    assert service.wait_indexed(timeout=60)
    first = _search(service, "omega", limit=5)
    assert [h["record"]["seq"] for h in first["result"]] == [1, 2, 3, 4, 5]
    assert _search(service, "omega", limit=5) == first


def test_explanation_names_context_items_and_assessment_fields(env):
    pub = publication("t", "s", "b", scope="scope kappa", conditions=["no", "kappa here"], limitations=["kappa"])
    rep = assessment(pub.id, "kappa summary")
    ret = retraction(pub.id, "kappa reason")
    relay, service = _service(env, [pub, rep, ret])
    wire = _search(service, "kappa")
    explanations = {h["record"]["envelope"]["hash"]: h["explanation"] for h in wire["result"]}
    assert "context.scope, context.conditions[1], context.limitations[0]" in explanations[pub.id]
    assert "'kappa' in summary" in explanations[rep.id]
    assert "'kappa' in reason" in explanations[ret.id]


def test_filters_are_exact_and_identical_to_query(env):
    a = publication("filter probe", "x", kind="hypothesis", language="EN", tags=["t1"], nonce=1)
    b = publication("filter probe", "x", kind="observation", language="en-US", tags=["t2"], nonce=2,
                    created_at=T0 + 10)
    c = assessment(a.id, "filter probe", verdict="challenges")
    relay, service = _service(env, [a, b, c])
    cases = [
        ({"kind": "hypothesis"}, [("kind", "hypothesis")]),
        ({"language": "en"}, [("language", "en")]),
        ({"tag": "t2"}, [("tag", "t2")]),
        ({"type": "knowledge.assess"}, [("type", "knowledge.assess")]),
        ({"verdict": "challenges"}, [("verdict", "challenges")]),
        ({"target": a.id}, [("target", a.id)]),
        ({"created_from": T0 + 1}, [("created_from", str(T0 + 1))]),
        ({"created_before": T0 + 10}, [("created_before", str(T0 + 10))]),
        ({"created_from": T0, "created_before": T0 + 11, "kind": "observation"},
         [("created_from", str(T0)), ("created_before", str(T0 + 11)), ("kind", "observation")]),
        ({"actor": a.actor, "type": "knowledge.publish"}, [("actor", a.actor), ("type", "knowledge.publish")]),
        ({"type": "knowledge.retract", "kind": "question"}, [("type", "knowledge.retract"), ("kind", "question")]),
    ]
    for filters, pairs in cases:
        wire = _search(service, "probe", filters=filters)
        expected = {r.envelope.id for r in relay.query([("q", "probe"), *pairs]).records}
        assert set(_ids(wire)) == expected, filters
        assert wire["coverage"]["exhaustive"] is True


def test_withheld_never_appear_and_reappear_when_shown(env):
    a = publication("hidden treasure", nonce=1)
    b = publication("visible treasure", nonce=2)
    relay, service = _service(env, [a, b])
    relay.withhold(a.id)
    wire = _search(service, "treasure")
    assert _ids(wire) == [b.id] and wire["coverage"]["exhaustive"] is True
    relay.unwithhold(a.id)
    assert set(_ids(_search(service, "treasure"))) == {a.id, b.id}


def test_index_lag_is_reported_and_results_stay_below_the_checkpoint(env):
    relay, service = _service(env, [publication("lagging one", nonce=1)])
    service._indexer.stop()  # the indexer falls behind
    late = publication("lagging two", nonce=2)
    relay.store.commit(late, T0)
    wire = _search(service, "lagging")
    assert wire["checkpoint"] == 2 and wire["index_seq"] == 1
    assert wire["coverage"] == {"exhaustive": False, "reasons": ["index_lag"]}
    assert late.id not in _ids(wire) and len(wire["result"]) == 1


def test_records_beyond_the_checkpoint_are_excluded(env):
    a = publication("race one", nonce=1)
    relay, service = _service(env, [a])
    b = publication("race two", nonce=2)
    relay.store.commit(b, T0)
    assert service.wait_indexed(timeout=60)
    from akrelay.protocol.reads import parse_search_request as parse

    # Pretend the checkpoint was captured before b committed: the index is ahead.
    real = relay.checkpoint
    relay.checkpoint = lambda: 1
    try:
        page = service.run(parse({"text": "race", "mode": "lexical"}, ("lexical",)))
    finally:
        relay.checkpoint = real
    assert [h.record.envelope.id for h in page.hits] == [a.id]
    assert page.checkpoint == 1 and page.index_seq == 2 and page.exhaustive


def test_candidate_budget_and_timeout_are_reported(env, monkeypatch):
    docs = [publication(f"budget item {i}", nonce=i + 1) for i in range(40)]
    docs.append(publication("budget rare zq", nonce=99))
    relay, service = _service(env, docs, budget=Budget(candidates=10))
    wire = _search(service, "budget", limit=100)
    assert wire["coverage"] == {"exhaustive": False, "reasons": ["candidate_limit"]}
    assert 1 <= len(wire["result"]) <= 10
    service.budget = Budget(candidates=1000, seconds=0.0)
    wire = _search(service, "budget", limit=5)
    # More than a page matched: truncation is a candidate limit, never "exhaustive".
    assert wire["coverage"]["exhaustive"] is False and "candidate_limit" in wire["coverage"]["reasons"]
    # One match among many candidates ("zq" left to verification), no time to verify them all.
    monkeypatch.setattr("akrelay.search.lexical.MAX_PREFIX_EXPANSION", 0)
    wire = _search(service, "budget zq", limit=2)
    assert wire["coverage"] == {"exhaustive": False, "reasons": ["timeout"]}
    assert len(wire["result"]) <= 1


def test_false_candidates_are_verified_away(env):
    # Every trigram of "abcd" occurs ("abc" and "bcd") but the term itself does not.
    decoy = publication("abc xbcd", nonce=1)
    real = publication("abcd", nonce=2)
    relay, service = _service(env, [decoy, real])
    wire = _search(service, "abcd")
    assert _ids(wire) == [real.id] and wire["coverage"]["exhaustive"] is True


def test_exhaustive_only_when_the_page_holds_every_match(env):
    docs = [publication(f"page {i}", nonce=i + 1) for i in range(5)]
    relay, service = _service(env, docs)
    assert _search(service, "page", limit=5)["coverage"]["exhaustive"] is True
    truncated = _search(service, "page", limit=4)
    assert truncated["coverage"] == {"exhaustive": False, "reasons": ["candidate_limit"]}
    assert len(truncated["result"]) == 4


def test_ranking_id_names_the_configuration():
    assert RANKING_ID == ranking_id(RANKING_CONFIG) and RANKING_ID.startswith("akrelay-lexical-bm25")
    assert ranking_id({**RANKING_CONFIG, "k1": 2.0}) != RANKING_ID
    assert ranking_id(dict(reversed(list(RANKING_CONFIG.items())))) == RANKING_ID


@pytest.mark.parametrize("body, code", [
    ({"text": "x", "mode": "semantic"}, "unsupported_search_mode"),
    ({"text": "x", "mode": "hybrid"}, "unsupported_search_mode"),
    ({"text": "x", "mode": "fuzzy"}, "unsupported_search_mode"),
    ({"text": "x"}, "invalid_request"),
    ({"mode": "lexical"}, "invalid_request"),
    ({"text": "", "mode": "lexical"}, "invalid_request"),
    ({"text": " \t", "mode": "lexical"}, "invalid_request"),
    ({"text": "x" * 1025, "mode": "lexical"}, "invalid_request"),
    ({"text": " ".join("t" * 17), "mode": "lexical"}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "limit": 0}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "limit": 101}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "limit": "5"}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "limit": True}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "extra": 1}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "cursor": "c"}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": {"q": "x"}}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": {"after_seq": 1}}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": {"foo": "bar"}}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": {"created_from": "1"}}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": {"created_from": 2, "created_before": 2}}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": {"actor": "did:agent:nope"}}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": {"kind": "essay"}}, "invalid_request"),
    ({"text": "x", "mode": "lexical", "filters": []}, "invalid_request"),
    (["text", "x"], "invalid_request"),
])
def test_request_errors(env, body, code):
    relay, service = _service(env, CORPUS[:1])
    before = (relay.checkpoint(), service.index_seq())
    with pytest.raises(ProtocolError) as exc:
        service.search(json.dumps(body).encode())
    assert exc.value.code == code and exc.value.message
    assert (relay.checkpoint(), service.index_seq()) == before


@pytest.mark.parametrize("raw", [
    b'{"text":"a","text":"b","mode":"lexical"}',  # duplicate member
    b'{"text":"\\ud800","mode":"lexical"}',  # lone surrogate
    b'{"text":"a","mode":"lexical"',  # truncated
    b'\xff\xfe',  # not UTF-8
    b'{"text":"a","mode":"lexical","limit":1e400}',
])
def test_strict_json_errors(env, raw):
    relay, service = _service(env, CORPUS[:1])
    with pytest.raises(ProtocolError) as exc:
        service.search(raw)
    assert exc.value.code == "invalid_request"
