"""The storage contract every backend must pass.

A backend's test module subclasses :class:`StoreContract` and provides two
factory fixtures: ``make_store`` (calling it twice on a durable backend must open
the *same* data again, which is how reopening is tested) and ``new_store``
(every call opens a fresh, empty store).
Nothing here names a backend, so the Redis store will run the same suite.

The exactness tests compare ``Store.query`` with a brute-force enumeration
that uses ``protocol.query.query_matches`` as the oracle, over a corpus of
real signed envelopes and random requests (hypothesis).
"""

from __future__ import annotations

import random
import threading
from dataclasses import replace
from functools import lru_cache
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.protocol.query import QueryRequest, query_matches, request_terms
from akrelay.protocol.signer import Signer, assess_event, publish_event, retract_event
from akrelay.protocol.text import ascii_fold
from akrelay.protocol import merkle
from akrelay.store import tlog
from akrelay.store.base import Record, event_hash_bytes

#: Every backend subclass runs the same hypothesis tests (differing executors by design);
#: fixtures are reset explicitly inside each example.
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.differing_executors]
LICENSE = "https://creativecommons.org/licenses/by/4.0/"
BASE_TIME = 1_790_553_600_000
KINDS = ("claim", "question", "hypothesis", "method", "negative_result", "observation")
RELATIONS = ("extends", "supersedes", "addresses", "tests", "derived_from", "supports")
VERDICTS = ("supports", "contradicts", "reproduced", "not_reproduced", "applied", "unclear")
TAGS = ("cache", "db", "ml", "x.y", "lang-zh")
LANGUAGES = ("en", "EN", "en-US", "zh", "de")
PROFILE_DIGESTS = ("JC3JB0-_nifwwWoPybM5fRubk5jbuqkHqFvU5bsd8xo", "txT8wzviFxiqJA9KzQKzRFJWCtZmVFiEybnYGddh1hw")
#: Words for fields; the query vocabulary below includes fragments, case variants,
#: short terms (below the trigram length) and non-ASCII text.
WORDS = ("Alpha", "beta", "GAMMA", "delta", "cache*", "语言知识", "café", "ab", "zz", "Ä", "e\u0301", "key-value", "Ω", "Supercalifragilistic")
QUERY_TERMS = (
    "alpha", "ALPHA", "lph", "beta", "gamma", "amm", "delta", "cache*", "cache", "语言", "语", "café", "caf",
    "ab", "a", "zz", "ä", "Ä", "e\u0301", "key-value", "value", "ω", "Ω", "absent", "*", "califragilistic", "supercalifragilisticx",
)


def envelope_from_signed(signed: dict[str, Any]) -> Envelope:
    """An :class:`Envelope` from a signed dict (trusted test data; no verification)."""
    event = signed["event"]
    return Envelope(id=signed["hash"], event=event, signature=signed["signature"], event_jcs=canonicalize(event))


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@lru_cache(maxsize=None)
def corpus(seed: int = 7, publications: int = 36, assessments: int = 12, retractions: int = 6) -> tuple[Envelope, ...]:
    """A dependency-ordered set of real signed envelopes with varied filter facts."""
    rng = random.Random(seed)
    signers = [Signer.from_seed(bytes([seed + i]) * 32) for i in range(3)]
    nonce = [1]
    pubs: list[Envelope] = []
    out: list[Envelope] = []

    def sign(build: Callable[..., dict], signer: Signer, payload: dict) -> Envelope:
        nonce[0] += 1
        created = BASE_TIME + rng.randrange(0, 20) * 1000
        return envelope_from_signed(signer.sign(build(signer.agent_id, created, nonce[0], payload)))

    for _ in range(publications):
        payload: dict[str, Any] = {
            "license": LICENSE,
            "kind": rng.choice(KINDS),
            "title": _text(rng, 2),
            "statement": _text(rng, 3),
            "language": rng.choice(LANGUAGES),
            "context": {
                "scope": _text(rng, 1),
                "conditions": [_text(rng, 1) for _ in range(rng.randrange(0, 3))],
                "limitations": [_text(rng, 1) for _ in range(rng.randrange(0, 2))],
            },
            "basis": _text(rng, 2),
            "extra": {"note": "extraonly alpha"},
        }
        tags = rng.sample(TAGS, rng.randrange(0, 3))
        if tags:
            payload["tags"] = tags
        if pubs and rng.random() < 0.6:
            rels = {}
            for _ in range(rng.randrange(1, 3)):
                rels[(rng.choice(RELATIONS), rng.choice(pubs).id)] = None
            payload["relations"] = [{"relation": r, "target": t} for r, t in rels]
        if rng.random() < 0.3:
            payload["profiles"] = [{"profile": {"url": "https://example.com/p", "digest": rng.choice(PROFILE_DIGESTS)}}]
        env = sign(publish_event, rng.choice(signers), payload)
        pubs.append(env)
        out.append(env)
    for _ in range(assessments):
        payload = {
            "license": LICENSE,
            "target": rng.choice(pubs).id,
            "verdict": rng.choice(("supports", "contradicts", "unclear")),
            "summary": _text(rng, 2),
            "context": {"scope": _text(rng, 1), "conditions": [], "limitations": [_text(rng, 1)]},
            "basis": _text(rng, 2),
        }
        env = sign(assess_event, rng.choice(signers), payload)
        out.append(env)
    for _ in range(retractions):
        target = rng.choice(pubs)
        signer = next(s for s in signers if s.agent_id == target.actor)
        env = sign(retract_event, signer, {"license": LICENSE, "target": target.id, "reason": _text(rng, 2)})
        out.append(env)
    return tuple(out)


def oracle(
    records: list[Record],
    request: QueryRequest,
    *,
    after_seq: int,
    upto_seq: int,
    limit: int,
    include_withheld: bool = False,
) -> list[int]:
    """Brute force: every visible record in the seq window matching the §9.3 predicate."""
    out = []
    for rec in sorted(records, key=lambda r: r.seq):
        if after_seq < rec.seq <= upto_seq and (include_withheld or not rec.withheld) and query_matches(rec.envelope, request):
            out.append(rec.seq)
    return out[:limit]


def run_query(store: Any, request: QueryRequest, **kw: Any) -> list[Record]:
    return store.query(request_terms(request), request.created_from, request.created_before, request.q or (), **kw)


@st.composite
def requests(draw: st.DrawFn, pool: tuple[Envelope, ...]) -> QueryRequest:
    """Random §9.3 requests whose filter values mostly occur in ``pool``."""
    actors = sorted({e.actor for e in pool})
    targets = sorted({e.payload["target"] for e in pool if "target" in e.payload} | {
        r["target"] for e in pool for r in e.payload.get("relations", ())
    })
    absent = "A" * 43
    fields: dict[str, Any] = {}
    maybe = lambda strat: draw(st.one_of(st.none(), strat))  # noqa: E731
    fields["actor"] = maybe(st.sampled_from(actors))
    fields["type"] = maybe(st.sampled_from(("knowledge.publish", "knowledge.assess", "knowledge.retract")))
    fields["kind"] = maybe(st.sampled_from(KINDS))
    fields["target"] = maybe(st.sampled_from(targets[:8] + [absent]))
    fields["relation"] = maybe(st.sampled_from(RELATIONS))
    fields["tag"] = maybe(st.sampled_from(TAGS))
    fields["profile"] = maybe(st.sampled_from(PROFILE_DIGESTS))
    fields["language"] = maybe(st.sampled_from(("en", "EN", "en-us", "zh", "fr")))
    fields["verdict"] = maybe(st.sampled_from(VERDICTS))
    # bounds often sit exactly on a created_at value, where inclusive/exclusive matters
    created = sorted({e.created_at for e in pool})
    bound = st.one_of(st.sampled_from(created), st.integers(BASE_TIME - 1000, BASE_TIME + 21000))
    lo = maybe(bound)
    hi = maybe(bound)
    if lo is not None and hi is not None and lo >= hi:
        lo, hi = (None, hi) if draw(st.booleans()) else (lo, None)
    fields["created_from"], fields["created_before"] = lo, hi
    terms = maybe(st.lists(st.sampled_from(QUERY_TERMS), min_size=1, max_size=3))
    if terms is not None:
        fields["q"] = tuple(dict.fromkeys(ascii_fold(t) for t in terms))
    # Keep most requests narrow enough to be interesting but not always empty.
    keep = draw(st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True))
    return QueryRequest(**{k: v for k, v in fields.items() if k in keep})


def assert_log_matches(store: Any) -> list[Any]:
    """The store's log is one entry per record in ``seq`` order, and its stored nodes give the RFC 9162 root."""
    n = store.log_size()
    entries = store.log_entries(0, n + 1)
    records = store.iter_records(0, n + 1)
    assert [(e.seq, e.hash) for e in entries] == [(r.seq, event_hash_bytes(r.id)) for r in records]
    leaves = [tlog.leaf_of(e.seq, e.hash) for e in entries]
    assert merkle.root_hash(n, store.log_nodes) == merkle.root_of_leaves(leaves)
    return entries


class StoreContract:
    """Subclass and provide ``make_store`` (a factory fixture)."""

    #: Backends that keep data across ``make_store()`` calls set this.
    durable = False

    # -- helpers -------------------------------------------------------------
    @pytest.fixture
    def store(self, make_store: Callable[[], Any]) -> Any:
        store = make_store()
        yield store
        store.close()

    # -- commit, idempotence, checkpoint ----------------------------------------
    def test_empty_store(self, store: Any) -> None:
        assert store.checkpoint() == 0
        assert store.get(corpus()[0].id) is None
        assert store.iter_records(0, 10) == []
        assert store.query() == []

    def test_commit_allocates_increasing_seq_and_checkpoint(self, store: Any) -> None:
        envs = corpus()[:5]
        for i, env in enumerate(envs, start=1):
            record, created = store.commit(env, BASE_TIME + i)
            assert created is True
            assert (record.seq, record.accepted_at, record.withheld) == (i, BASE_TIME + i, False)
            assert store.checkpoint() == i
        got = store.get(envs[2].id)
        assert got is not None and got.seq == 3 and got.accepted_at == BASE_TIME + 3
        assert got.envelope.canonical_bytes() == envs[2].canonical_bytes()
        assert got.envelope.event == envs[2].event

    def test_commit_is_idempotent(self, store: Any) -> None:
        env = corpus()[0]
        first, created = store.commit(env, 111)
        again, created_again = store.commit(env, 999)
        assert created is True and created_again is False
        assert (again.seq, again.accepted_at) == (first.seq, 111)
        assert store.checkpoint() == 1
        assert [r.seq for r in store.iter_records(0, 10)] == [1]

    def test_commit_many_matches_commit(self, store: Any) -> None:
        envs = corpus()[:4]
        store.commit(envs[1], 1)
        out = store.commit_many([(envs[0], 2), (envs[1], 3), (envs[2], 4), (envs[0], 5), (envs[3], 6)])
        assert [(r.seq, created) for r, created in out] == [(2, True), (1, False), (3, True), (2, False), (4, True)]
        assert [r.accepted_at for r, _ in out] == [2, 1, 4, 2, 6]
        assert store.checkpoint() == 4

    def test_try_commit_many_matches_commit_many_when_it_commits(self, store: Any) -> None:
        envs = corpus()[:4]
        store.commit(envs[1], 1)
        out = store.try_commit_many([(envs[0], 2), (envs[1], 3), (envs[2], 4), (envs[0], 5), (envs[3], 6)])
        # No other writer exists here, so every backend commits at once.
        assert out is not None
        assert [(r.seq, created) for r, created in out] == [(2, True), (1, False), (3, True), (2, False), (4, True)]
        assert [r.accepted_at for r, _ in out] == [2, 1, 4, 2, 6]
        assert store.checkpoint() == 4
        assert [r.envelope.id for r in store.iter_records(0, 10)] == [envs[1].id, envs[0].id, envs[2].id, envs[3].id]

    def test_get_many_returns_only_retained(self, store: Any) -> None:
        envs = corpus()[:3]
        for env in envs[:2]:
            store.commit(env, 1)
        got = store.get_many([envs[2].id, envs[0].id, envs[1].id, envs[0].id])
        assert set(got) == {envs[0].id, envs[1].id}
        assert got[envs[1].id].seq == 2

    def test_iter_records_pages_in_seq_order(self, store: Any) -> None:
        envs = corpus()[:7]
        for env in envs:
            store.commit(env, 1)
        store.set_withheld(envs[1].id, True)
        seen = []
        after = 0
        while batch := store.iter_records(after, 3):
            seen.extend(r.envelope.id for r in batch)
            after = batch[-1].seq
        assert seen == [e.id for e in envs]  # withheld included

    def test_record_json_splices_canonical_bytes(self, store: Any) -> None:
        import json

        env = corpus()[0]
        record, _ = store.commit(env, 42)
        wire = json.loads(store.get(env.id).to_json())
        assert wire == {"envelope": env.to_dict(), "accepted_at": 42, "seq": 1}
        assert wire == record.to_dict()

    # -- concurrency --------------------------------------------------------------
    def test_concurrent_commits_get_unique_contiguous_seqs(self, make_store: Callable[[], Any]) -> None:
        store = make_store()
        envs = list(corpus())
        results: list[tuple[Record, bool]] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker(chunk: list[Envelope]) -> None:
            try:
                for env in chunk:
                    # every envelope is submitted by two threads at once
                    out = store.commit(env, 5)
                    with lock:
                        results.append(out)
            except BaseException as exc:  # noqa: BLE001 # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(envs[i::4],)) for i in range(4)]
        threads += [threading.Thread(target=worker, args=(envs[i::4][::-1],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        created = [r for r, c in results if c]
        assert len(created) == len(envs)
        assert sorted(r.seq for r in created) == list(range(1, len(envs) + 1))
        by_id = {r.envelope.id: r.seq for r in created}
        assert all(by_id[r.envelope.id] == r.seq for r, c in results if not c)
        assert store.checkpoint() == len(envs)
        assert_log_matches(store)
        store.close()

    # -- withheld -------------------------------------------------------------------
    def test_withheld_records_are_kept_but_hidden_from_query(self, store: Any) -> None:
        envs = corpus()[:4]
        for env in envs:
            store.commit(env, 1)
        assert store.set_withheld(envs[1].id, True) is True
        rec = store.get(envs[1].id)
        assert rec is not None and rec.withheld is True and rec.seq == 2
        assert store.get_many([envs[1].id])[envs[1].id].withheld is True
        assert [r.seq for r in store.query()] == [1, 3, 4]
        assert [r.seq for r in store.query(include_withheld=True)] == [1, 2, 3, 4]
        # resubmission of a withheld envelope returns the retained record unchanged
        again, created = store.commit(envs[1], 999)
        assert created is False and again.seq == 2 and again.withheld is True
        assert store.set_withheld(envs[1].id, False) is True
        assert store.get(envs[1].id).withheld is False
        assert [r.seq for r in store.query()] == [1, 2, 3, 4]
        assert store.set_withheld("B" * 43, True) is False

    # -- removal and the high-water mark -------------------------------------------
    def test_high_water_mark_survives_removal_and_restore(self, make_store: Callable[[], Any]) -> None:
        store = make_store()
        envs = corpus()[:4]
        for env in envs[:3]:
            store.commit(env, 1)
        assert store.remove(envs[2].id) is True
        assert store.remove(envs[2].id) is False
        assert store.get(envs[2].id) is None
        assert store.checkpoint() == 3
        assert [r.seq for r in store.query()] == [1, 2]
        if self.durable:
            store.close()
            store = make_store()
            assert store.checkpoint() == 3
        record, created = store.commit(envs[3], 2)
        assert created and record.seq == 4
        # restoring the removed envelope is a new acceptance with a larger seq
        restored, created = store.commit(envs[2], 3)
        assert created and restored.seq == 5
        assert store.checkpoint() == 5
        assert store.remove(envs[2].id) and store.remove(envs[3].id)
        if self.durable:
            store.close()
            store = make_store()
        assert store.checkpoint() == 5
        assert store.commit(envs[3], 4)[0].seq == 6
        store.close()

    def test_removed_record_leaves_no_index_entries(self, store: Any) -> None:
        env = next(e for e in corpus() if e.type == "knowledge.publish" and "tags" in e.payload)
        store.commit(env, 1)
        tag = env.payload["tags"][0]
        word = ascii_fold(env.payload["title"].split()[0])
        assert len(store.query([("tag", tag)], text_terms=[word])) == 1
        store.remove(env.id)
        assert store.query([("tag", tag)]) == []
        assert store.query(text_terms=[word]) == []

    # -- metadata -------------------------------------------------------------------
    def test_meta_area(self, make_store: Callable[[], Any]) -> None:
        store = make_store()
        assert store.meta_get("k") is None
        assert store.meta_setdefault("k", b"one") == b"one"
        assert store.meta_setdefault("k", b"two") == b"one"
        store.meta_set("k", b"three")
        store.meta_set("pos", b"\x00\x01")
        assert store.meta_get("k") == b"three"
        if self.durable:
            store.close()
            store = make_store()
        assert store.meta_get("pos") == b"\x00\x01"
        store.close()

    def test_meta_replace_is_compare_and_set(self, make_store: Callable[[], Any]) -> None:
        store = make_store()
        assert store.meta_replace("cp", None, b"one") is True
        assert store.meta_replace("cp", None, b"two") is False
        assert store.meta_replace("cp", b"other", b"two") is False
        assert store.meta_replace("cp", b"one", b"two") is True
        if self.durable:
            store.close()
            store = make_store()
        assert store.meta_get("cp") == b"two"
        store.close()

    # -- the Merkle log of acceptances (issue 23) -------------------------------------------------
    def test_log_follows_every_commit_path(self, store: Any) -> None:
        envs = corpus()[:12]
        assert store.log_size() == 0 and store.log_entries(0, 10) == []
        assert merkle.root_hash(0, store.log_nodes) == merkle.EMPTY_ROOT
        first, _ = store.commit(envs[0], 1)
        assert first.log_index == 0  # the commit that created it knows its leaf
        store.commit(envs[0], 2)  # a duplicate adds no entry
        store.commit_many([(envs[1], 3), (envs[2], 4), (envs[1], 5)])
        assert store.try_commit_many([(envs[3], 6), (envs[0], 7)]) is not None
        for env in envs[4:]:
            store.commit(env, 8)
        assert store.log_size() == store.checkpoint() == 12
        entries = assert_log_matches(store)
        assert [e.hash for e in entries] == [event_hash_bytes(env.id) for env in envs]
        assert [e.index for e in entries] == list(range(12)) and [e.seq for e in entries] == list(range(1, 13))
        assert store.log_index(5) == 4 and store.log_index(99) is None
        assert [e.index for e in store.log_entries(10, 5)] == [10, 11] and store.log_entries(12, 5) == []
        with pytest.raises(KeyError):
            store.log_nodes([(0, 12)])

    def test_log_keeps_withheld_and_removed_entries(self, store: Any) -> None:
        envs = corpus()[:5]
        for env in envs:
            store.commit(env, 1)
        root = merkle.root_hash(5, store.log_nodes)
        store.set_withheld(envs[1].id, True)
        store.remove(envs[3].id)
        assert [e.withheld for e in store.log_entries(0, 5)] == [False, True, False, None, False]
        assert store.log_size() == 5 and merkle.root_hash(5, store.log_nodes) == root

    def test_log_proofs_from_stored_nodes_verify(self, store: Any) -> None:
        envs = corpus()
        store.commit_many([(env, 1) for env in envs[:20]])
        root20 = merkle.root_hash(20, store.log_nodes)
        for env in envs[20:]:
            store.commit(env, 2)
        n = store.log_size()
        root = merkle.root_hash(n, store.log_nodes)
        leaves = [tlog.leaf_of(e.seq, e.hash) for e in store.log_entries(0, n)]
        assert root == merkle.root_of_leaves(leaves)
        for i in (0, 7, 19, n - 1):
            proof = merkle.inclusion_proof(i, n, store.log_nodes)
            assert merkle.verify_inclusion(i, n, leaves[i], proof, root)
        proof = merkle.consistency_proof(20, n, store.log_nodes)
        assert merkle.verify_consistency(20, n, root20, root, proof)

    def test_log_survives_reopening(self, make_store: Callable[[], Any]) -> None:
        if not self.durable:
            pytest.skip("not durable")
        envs = corpus()
        store = make_store()
        for env in envs[:9]:
            store.commit(env, 1)
        root9 = merkle.root_hash(9, store.log_nodes)
        store.close()
        store = make_store()
        assert store.log_size() == 9 and merkle.root_hash(9, store.log_nodes) == root9
        store.commit_many([(env, 2) for env in envs[9:15]])
        assert_log_matches(store)
        assert merkle.verify_consistency(9, 15, root9, merkle.root_hash(15, store.log_nodes),
                                         merkle.consistency_proof(9, 15, store.log_nodes))
        store.close()

    # -- exact enumeration ----------------------------------------------------------
    def test_query_examples(self, store: Any) -> None:
        envs = corpus()
        for env in envs:
            store.commit(env, 1)
        pub = next(e for e in envs if e.type == "knowledge.publish" and e.payload.get("relations"))
        rel = pub.payload["relations"][0]
        req = QueryRequest(relation=rel["relation"], target=rel["target"])
        got = [r.envelope.id for r in run_query(store, req, limit=1000)]
        assert pub.id in got
        assert got == [e.id for e in envs if query_matches(e, req)]
        assert run_query(store, QueryRequest(q=("absent",)), limit=1000) == []
        # limit and the seq window
        assert [r.seq for r in store.query(after_seq=3, upto_seq=9, limit=4)] == [4, 5, 6, 7]
        assert store.query(after_seq=9, upto_seq=9) == []

    @settings(max_examples=150, deadline=None, suppress_health_check=_SUPPRESS)
    @given(data=st.data())
    def test_query_equals_brute_force(self, loaded_store: tuple[Any, list[Envelope]], data: st.DataObject) -> None:
        store, envs = loaded_store
        n = len(envs)
        hidden = set(data.draw(st.lists(st.integers(1, n), max_size=5), label="withheld seqs"))
        for seq, env in enumerate(envs, start=1):
            store.set_withheld(env.id, seq in hidden)
        request = data.draw(requests(corpus()), label="request")
        after = data.draw(st.integers(0, n), label="after_seq")
        upto = data.draw(st.integers(after, n + 2), label="upto_seq")
        limit = data.draw(st.integers(1, 12), label="limit")
        include = data.draw(st.booleans(), label="include_withheld")
        records = [store.get(e.id) for e in envs]
        expected = oracle(records, request, after_seq=after, upto_seq=upto, limit=limit, include_withheld=include)
        got = run_query(store, request, after_seq=after, upto_seq=upto, limit=limit, include_withheld=include)
        assert [r.seq for r in got] == expected
        assert all(r.withheld == (r.seq in hidden) for r in got)
        # paging through with small limits enumerates the same complete list
        full = oracle(records, request, after_seq=after, upto_seq=upto, limit=10**6, include_withheld=include)
        paged: list[int] = []
        last = after
        while page := run_query(store, request, after_seq=last, upto_seq=upto, limit=limit, include_withheld=include):
            paged.extend(r.seq for r in page)
            last = page[-1].seq
        assert paged == full

    @settings(max_examples=80, deadline=None, suppress_health_check=_SUPPRESS)
    @given(data=st.data())
    def test_text_queries_equal_brute_force(self, loaded_store: tuple[Any, list[Envelope]], data: st.DataObject) -> None:
        """``q`` alone or with one broad filter: the path where text candidates drive the scan."""
        store, envs = loaded_store
        n = len(envs)
        for env in envs:
            store.set_withheld(env.id, False)
        terms = data.draw(st.lists(st.sampled_from(QUERY_TERMS), min_size=1, max_size=3), label="q")
        extra = data.draw(st.sampled_from(({}, {"type": "knowledge.publish"}, {"created_from": BASE_TIME + 5000})), label="filter")
        request = QueryRequest(q=tuple(dict.fromkeys(ascii_fold(t) for t in terms)), **extra)
        after = data.draw(st.integers(0, n), label="after_seq")
        limit = data.draw(st.integers(1, 8), label="limit")
        records = [store.get(e.id) for e in envs]
        full = oracle(records, request, after_seq=after, upto_seq=n, limit=10**6)
        paged: list[int] = []
        last = after
        while page := run_query(store, request, after_seq=last, upto_seq=n, limit=limit):
            assert len(page) <= limit
            paged.extend(r.seq for r in page)
            last = page[-1].seq
        assert paged == full

    @pytest.fixture
    def loaded_store(self, make_store: Callable[[], Any]) -> Any:
        store = make_store()
        envs = list(corpus())
        for i, env in enumerate(envs):
            store.commit(env, BASE_TIME + i)
        yield store, envs
        store.close()

    @settings(max_examples=25, deadline=None, suppress_health_check=_SUPPRESS)
    @given(data=st.data())
    def test_random_corpora_equal_brute_force(self, new_store: Callable[[], Any], data: st.DataObject) -> None:
        pool = corpus(seed=data.draw(st.sampled_from((7, 11, 23)), label="corpus seed"))
        chosen = data.draw(st.lists(st.integers(0, len(pool) - 1), unique=True, max_size=len(pool)), label="subset")
        store = new_store()
        try:
            for i in chosen:
                store.commit(pool[i], i)
            records = [store.get(pool[i].id) for i in chosen]
            for _ in range(5):
                request = data.draw(requests(pool), label="request")
                request = replace(request)
                expected = oracle(records, request, after_seq=0, upto_seq=len(chosen), limit=10**6)
                got = run_query(store, request, after_seq=0, upto_seq=len(chosen), limit=10**6)
                assert [r.seq for r in got] == expected
        finally:
            store.close()
