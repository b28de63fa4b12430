"""The search index's question mode: words OR-ed, stop words dropped, BM25, one snapshot."""

from __future__ import annotations

from akrelay.search.question import question_terms

from .kq_harness import knowql_app


def test_question_terms_drop_stop_words_fold_and_dedupe() -> None:
    assert question_terms("What is the CACHE doing, and why is the cache cold?") == ("cache", "cold")
    assert question_terms("what is it?") == ()
    assert question_terms("") == ()
    assert len(question_terms(" ".join(f"word{i}" for i in range(40)))) == 16


def test_question_mode_ranks_partial_matches_within_the_snapshot() -> None:
    with knowql_app() as kq:
        c = kq.corpus
        both = c.publish("alice", "Cache eviction policy", "Eviction removes the coldest cache entries.")
        one = c.publish("bob", "Eviction notices", "Tenants get notices before eviction.")
        none = c.publish("carol", "Weather", "Sunny.")
        kq.submit(both, one, none)
        service = kq.node.search.engine
        hits, position = service.question(("cache", "eviction"), 3, 10)
        assert position == 3
        assert [h.record.id for h in hits] == [both["hash"], one["hash"]]  # OR: one word suffices
        assert hits[0].score > hits[1].score
        hits, _ = service.question(("cache", "eviction"), 1, 10)  # snapshot seq 1
        assert [h.record.id for h in hits] == [both["hash"]]
        assert service.question((), 3, 10)[0] == []
        kq.relay.withhold(both["hash"])
        assert [h.record.id for h in service.question(("cache", "eviction"), 3, 10)[0]] == [one["hash"]]
