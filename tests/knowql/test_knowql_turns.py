"""KnowQL turns through the real app: answers, retrieval modes, sessions, streams, background, cancel."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import validator
from .kq_harness import knowql_app, sse_frames

QUERY = validator("Query")
EVENT = validator("QueryEvent")
SESSION = validator("SessionResponse")


def _world(kq):
    """Four capsules with known beliefs under akrelay:corroborated, and their ids."""
    c = kq.corpus
    accepted = c.publish("alice", "Cache invalidation on restart", "Restarting the worker clears the LRU cache.")
    contested = c.publish("bob", "Cache warmup duration", "Warming the cache takes 30 seconds after restart.")
    rejected = c.publish("carol", "Cache survives restart", "The cache persists across a restart of the worker.",
                         kind="hypothesis")
    lonely = c.publish("dave", "Cache size after restart", "After a restart the cache holds 100 entries.")
    kq.submit(accepted, contested, rejected, lonely,
              c.assess("carol", accepted["hash"], "supports", "Confirmed: the cache is cleared."),
              c.assess("dave", contested["hash"], "challenges", "Warmup took five minutes here."),
              c.assess("alice", contested["hash"], "supports", "Measured thirty seconds."),
              c.assess("alice", rejected["hash"], "challenges", "It did not persist."))
    return {"accepted": accepted["hash"], "contested": contested["hash"], "rejected": rejected["hash"],
            "unconfirmed": lonely["hash"]}


def _text(doc):
    return "".join(part["text"] for item in doc["output"] for part in item["content"])


def test_extractive_answer_groups_by_belief_and_cites_the_retrieved_set() -> None:
    with knowql_app() as kq:
        ids = _world(kq)
        r = kq.ask({"ask": "What happens to the cache after a restart?", "scope": ["knowledge"]})
        assert r.status_code == 200 and r.headers["x-pinecone-api-version"] == "2026-07"
        doc = r.json()
        QUERY.validate(doc)
        assert doc["status"] == "completed" and doc["object"] == "query" and doc["model"] == "akrelay/extractive-1"
        assert doc["previous_query_id"] is None and doc["input"] == [
            {"role": "user", "content": "What happens to the cache after a restart?"}]
        text = _text(doc)
        beliefs = {c["source"]: c["belief"] for c in doc["citations"]}
        assert beliefs == {ids[k]: k if k != "unconfirmed" else "uncertain" for k in ids}
        # Every statement carries a marker whose citation is in the retrieved set.
        for n, citation in enumerate(doc["citations"], start=1):
            assert f"[{n}]" in text
        assert "Findings (accepted):\n- Cache invalidation on restart: Restarting the worker clears" in text
        assert "(contested: 1 supporting / 1 rejecting assessments)" in text
        assert "Cache size after restart (unconfirmed, uncorroborated)" in text
        # A rejected capsule is reported, never stated as fact.
        assert "The cache persists across a restart" not in text
        assert "Cache survives restart (rejected: 1 rejecting / 0 supporting assessments; not stated as fact)" in text
        assert doc["akrelay"]["snapshot_seq"] == 8 and doc["akrelay"]["policy"] == "akrelay:corroborated"
        # Same ask, same snapshot: the same retrieval and the same answer.
        again = kq.ask({"ask": "What happens to the cache after a restart?", "scope": ["knowledge"]}).json()
        assert _text(again) == text and again["citations"] == doc["citations"]


def test_policy_is_pinned_through_vars() -> None:
    with knowql_app() as kq:
        ids = _world(kq)
        doc = kq.ask({"ask": "cache size restart", "scope": ["knowledge"],
                      "vars": {"policy": "kip:structural"}}).json()
        beliefs = {c["source"]: c["belief"] for c in doc["citations"]}
        assert beliefs[ids["unconfirmed"]] == "accepted" and doc["akrelay"]["policy"] == "kip:structural"


def test_no_hits_and_no_searchable_words_complete_without_citations() -> None:
    with knowql_app() as kq:
        _world(kq)
        for ask in ("zeppelin hydrodynamics", "What is it that was there?", "?!"):
            doc = kq.ask({"ask": ask, "scope": ["knowledge"]}).json()
            QUERY.validate(doc)
            assert doc["status"] == "completed" and doc["citations"] == [] and _text(doc)
        env = kq.ask({"ask": "what is it?", "scope": ["knowledge"], "retrieval_only": True}).json()["output_json"]
        assert env["retrieval"]["keyword_query"] is None and env["counts"] == {"chunks": 0, "artifacts": 0}


def test_retractions_withheld_records_and_retracted_assessments_never_support() -> None:
    with knowql_app() as kq:
        c = kq.corpus
        kept = c.publish("alice", "Gasket pressure limit", "The gasket holds 12 bar.")
        gone = c.publish("bob", "Gasket pressure rating", "The gasket is rated for 40 bar.")
        hidden = c.publish("carol", "Gasket pressure test", "The gasket failed at 9 bar.")
        support = c.assess("dave", kept["hash"], "supports", "Gasket pressure reproduced at 12 bar.")
        kq.submit(kept, gone, hidden, support, c.retract("bob", gone["hash"], "Gasket rating was wrong."),
                  c.retract("dave", support["hash"], "Gasket test was flawed."))
        kq.relay.withhold(hidden["hash"])
        doc = kq.ask({"ask": "gasket pressure", "scope": ["knowledge"], "retrieval_only": True}).json()
        env = doc["output_json"]
        sources = {i["source"] for i in env["chunks"] + env["artifacts"]}
        assert sources == {kept["hash"]}
        artifact = env["artifacts"][0]
        # The only support left is the author's own: unconfirmed, and the retracted assessment is gone.
        assert artifact["belief"]["status"] == "uncertain" and artifact["belief"]["supporting"] == 0


def test_retrieval_modes_follow_the_precedence_and_caps() -> None:
    with knowql_app() as kq:
        _world(kq)
        base = {"ask": "cache restart", "scope": ["knowledge"]}

        def env(**flags):
            doc = kq.ask({**base, **flags}).json()
            QUERY.validate(doc)
            assert doc["status"] == "completed" and doc["model"] is None and doc["citations"] == []
            return doc["output_json"]

        full = env(retrieval_only=True)
        assert full["answered_by"] == "retrieval" and full["mode"] == "retrieval_only"
        assert set(full) == {"answered_by", "mode", "counts", "chunks", "artifacts", "retrieval"}
        assert full["counts"] == {"chunks": len(full["chunks"]), "artifacts": len(full["artifacts"])}
        assert full["artifacts"] and full["chunks"]
        assert full["retrieval"]["keyword_query"] == "cache restart"
        assert full["retrieval"]["matched_artifacts"] == [a["id"] for a in full["artifacts"]]
        assert all(a["type"] == "KnowledgeCapsule" and a["belief"]["status"] for a in full["artifacts"])
        assert env(compose=False) == full
        assert env(chunks_only=True, artifacts_only=True, retrieval_only=True)["artifacts"] == []
        only = env(artifacts_only=True, retrieval_only=True)
        assert only["mode"] == "artifacts_only" and only["chunks"] == []
        pointers = env(pointers_only=True)
        assert pointers["mode"] == "pointers_only"
        assert all("text" not in item for item in pointers["chunks"] + pointers["artifacts"])
        capped = env(retrieval_only=True, max_retrieved=3, max_retrieved_chars=10)
        assert len(capped["chunks"]) + len(capped["artifacts"]) == 3
        for item in capped["chunks"] + capped["artifacts"]:
            assert len(item["text"]) <= 10 and item["truncated"] is (len(item["text"]) == 10)
        # shape is ignored in retrieval modes, with a warning
        shaped = kq.ask({**base, "retrieval_only": True, "shape": {"type": "object", "required": ["x"]}}).json()
        assert shaped["output_json"]["answered_by"] == "retrieval" and shaped["akrelay"]["warnings"]


def test_shape_is_bound_and_validated_or_the_turn_fails() -> None:
    with knowql_app() as kq:
        ids = _world(kq)
        shape = {"type": "object", "properties": {
            "answer": {"type": "string"}, "found": {"type": "boolean"}, "count": {"type": "integer"},
            "sources": {"type": "array", "items": {"type": "string"}},
            "results": {"type": "array", "items": {"type": "object", "properties": {
                "id": {"type": "string"}, "status": {"type": "string"}}, "required": ["id", "status"]}}},
            "required": ["answer", "found", "sources"], "additionalProperties": False}
        doc = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "shape": shape}).json()
        QUERY.validate(doc)
        assert doc["status"] == "completed"
        out = doc["output_json"]
        assert out["found"] is True and out["count"] == 4 and set(out["sources"]) == set(ids.values())
        assert {r["id"]: r["status"] for r in out["results"]}[ids["contested"]] == "contested"
        # A required property the extractive composer cannot derive fails the turn, clearly.
        failed = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "shape": {
            "type": "object", "properties": {"qualifies": {"type": "boolean"}}, "required": ["qualifies"]}}).json()
        QUERY.validate(failed)
        assert failed["status"] == "failed" and "'qualifies'" in failed["error"] and failed["output_json"] is None
        # A bindable property whose value breaks the shape fails too (never silently non-conforming).
        bad = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "shape": {
            "type": "object", "properties": {"count": {"type": "integer", "maximum": 1}}, "required": ["count"]}})
        assert bad.json()["status"] == "failed" and "does not conform" in bad.json()["error"]
        # shape is per turn: the next turn on the session is free-form again.
        later = kq.ask({"ask": "cache restart", "previous_query_id": doc["id"]}).json()
        assert later["status"] == "completed" and later["output_json"] is None


def test_sessions_pin_fields_chain_queries_and_replay_history() -> None:
    with knowql_app() as kq:
        _world(kq)
        first = kq.ask({"ask": "What about cache warmup duration?", "scope": ["knowledge"],
                        "system_prompt": "Be brief.", "guardrails": "No guesses.", "model": "lite",
                        "tools": ["search"], "vars": {"team": "ops"}, "workflow": "search"}).json()
        sid = first["session_id"]
        second = kq.ask({"ask": "and after a restart?", "session_id": sid, "scope": ["no-such-context"],
                         "system_prompt": "ignored", "retrieval_only": True}).json()
        assert second["status"] == "completed" and second["previous_query_id"] == first["id"]
        variants = second["output_json"]["retrieval"]["query_variants"]
        assert variants[0] == "and after a restart?" and "warmup" in variants[1]
        third = kq.ask({"ask": "cache size", "previous_query_id": first["id"]}).json()
        assert third["session_id"] == sid and third["previous_query_id"] == second["id"]  # appended, linear
        r = kq.client.get(f"/sessions/{sid}")
        session = r.json()
        SESSION.validate(session)
        assert r.headers["x-pinecone-api-version"] == "2026-07"
        assert session["scope"] == ["knowledge"] and session["system_prompt"] == "Be brief."
        assert session["guardrails"] == "No guesses." and session["models"] == ["lite"]
        assert session["tools"] == ["search"] and session["vars"] == {"team": "ops"}
        assert session["title"] == "What about cache warmup duration?"
        assert session["last_query_id"] == third["id"]
        assert [q["id"] for q in session["queries"]] == [first["id"], second["id"], third["id"]]
        d = kq.client.delete(f"/sessions/{sid}")
        validator("DeleteSessionResponse").validate(d.json())
        assert d.status_code == 200 and d.json() == {"deleted": True}
        assert kq.client.delete(f"/sessions/{sid}").json() == {"deleted": False}
        assert kq.client.get(f"/sessions/{sid}").status_code == 404
        assert kq.client.get(f"/queries/{first['id']}").status_code == 404


def test_stream_frames_follow_seed_003_and_replay_from_the_store() -> None:
    with knowql_app() as kq:
        _world(kq)
        r = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-pinecone-api-version"] == "2026-07"
        frames = sse_frames(r.text)
        final = frames[-1]
        assert final["event"] == "query" and final["id"] is None
        doc = final["data"]
        QUERY.validate(doc)
        progress = frames[:-1]
        assert [int(f["id"]) for f in progress] == list(range(1, len(progress) + 1))
        for f in progress:
            EVENT.validate(f["data"])
            assert f["event"] == f["data"]["type"] and f["data"]["query_id"] == doc["id"]
        types = [f["event"] for f in progress]
        assert types[0] == "response.created" and progress[0]["data"]["session_id"] == doc["session_id"]
        assert types[-1] == "response.completed" and types.count("response.completed") == 1
        assert "response.output_text.delta" in types and "response.turn_rollup" in types
        deltas = "".join(f["data"]["delta"] for f in progress if f["event"] == "response.output_text.delta")
        assert deltas == _text(doc)
        # The events are persisted: any worker replays them, and Last-Event-ID resumes inclusively.
        replay = sse_frames(kq.client.get(f"/queries/{doc['id']}/events").text)
        assert [(f["id"], f["event"]) for f in replay] == [(f["id"], f["event"]) for f in frames]
        resumed = sse_frames(kq.client.get(f"/queries/{doc['id']}/events", headers={"Last-Event-ID": "3"}).text)
        assert resumed[0]["id"] == "3" and resumed[-1]["event"] == "query"
        # Accept: text/event-stream negotiates a stream when "stream" is absent; stream:false wins.
        neg = kq.ask({"ask": "cache", "scope": ["knowledge"]}, headers={"accept": "text/event-stream"})
        assert sse_frames(neg.text)[-1]["event"] == "query"
        plain = kq.ask({"ask": "cache", "scope": ["knowledge"], "stream": False},
                       headers={"accept": "text/event-stream"})
        assert plain.headers["content-type"].startswith("application/json")


def test_background_answers_202_then_polls_to_completion() -> None:
    with knowql_app() as kq:
        _world(kq)
        r = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "background": True})
        assert r.status_code == 202 and r.headers["x-pinecone-api-version"] == "2026-07"
        doc = r.json()
        QUERY.validate(doc)
        assert doc["status"] == "in_progress" and doc["output"] == [] and doc["citations"] == []
        deadline = time.monotonic() + 60
        while doc["status"] == "in_progress" and time.monotonic() < deadline:
            time.sleep(0.02)
            doc = kq.client.get(f"/queries/{doc['id']}").json()
        QUERY.validate(doc)
        assert doc["status"] == "completed" and doc["citations"]


def test_cancel_is_idempotent_and_releases_the_session(slow) -> None:
    with knowql_app() as kq:
        _world(kq)
        doc = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "background": True,
                      "models": ["test/slow"]}).json()
        assert slow.entered.wait(60)
        busy = kq.ask({"ask": "again", "session_id": doc["session_id"]})
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "session_busy"
        cancelled = kq.client.post(f"/queries/{doc['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        QUERY.validate(cancelled.json())
        slow.gate.set()
        again = kq.client.post(f"/queries/{doc['id']}/cancel").json()
        assert again == cancelled.json()
        events = sse_frames(kq.client.get(f"/queries/{doc['id']}/events").text)
        assert [f["event"] for f in events][-2:] == ["response.cancelled", "query"]
        assert events[-1]["data"]["status"] == "cancelled"
        # The slot is free again; a completed turn can also be "cancelled" and stays completed.
        nxt = kq.ask({"ask": "cache restart", "session_id": doc["session_id"]}).json()
        assert nxt["status"] == "completed"
        assert kq.client.post(f"/queries/{nxt['id']}/cancel").json()["status"] == "completed"


def test_synchronous_timeout_is_504_and_the_turn_is_failed(slow) -> None:
    with knowql_app() as kq:
        _world(kq)
        r = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "models": ["test/slow"], "timeout_seconds": 1})
        assert r.status_code == 504 and r.headers["x-pinecone-api-version"] == "2026-07"
        error = r.json()["error"]
        assert error["code"] == "timeout" and error["message"] == "timed out after 1 s"
        doc = kq.client.get(f"/queries/{error['query_id']}").json()
        QUERY.validate(doc)
        assert doc["status"] == "failed" and doc["error"] == "timed out after 1 s"
        assert doc["session_id"] == error["session_id"]
        slow.gate.set()
        nxt = kq.ask({"ask": "cache", "session_id": error["session_id"], "retrieval_only": True})
        assert nxt.status_code == 200  # the timed-out turn released the session


def test_streamed_timeout_ends_with_failed_then_query(slow) -> None:
    with knowql_app() as kq:
        _world(kq)
        r = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "models": ["test/slow"], "timeout_seconds": 1,
                    "stream": True})
        frames = sse_frames(r.text)
        assert [f["event"] for f in frames][-2:] == ["response.failed", "query"]
        assert frames[-1]["data"]["status"] == "failed" and frames[-2]["data"]["error"] == "timed out after 1 s"


def test_models_contexts_and_discovery(tmp_path) -> None:
    contexts = tmp_path / "contexts.json"
    contexts.write_text(json.dumps({"contexts": [
        {"slug": "ops-notes", "name": "Ops notes", "filter": {"tags": ["ops"]}},
        {"slug": "drafts", "name": "Drafts", "queryable": False}]}))
    with knowql_app(knowql_contexts=str(contexts)) as kq:
        c = kq.corpus
        ops = c.publish("alice", "Cache restart runbook", "Restart the cache worker nightly.", tags=("ops",))
        kq.submit(ops, c.publish("bob", "Cache restart myths", "Restarts fix cache bugs."))
        models = kq.client.get("/models")
        validator("ModelCatalog").validate(models.json())
        assert models.json()["default"] == "akrelay/extractive-1"
        assert set(models.json()["tiers"]) == {"lite", "standard", "pro"}
        listed = kq.client.get("/contexts", headers={"X-Pinecone-Api-Version": "unstable"})
        assert listed.headers["x-pinecone-api-version"] == "unstable"
        by_slug = {c["slug"]: c for c in listed.json()}
        assert set(by_slug) == {"knowledge", "ops-notes", "drafts"} and by_slug["drafts"]["queryable"] is False
        assert all({"id", "slug", "name", "queryable"} <= set(c) for c in listed.json())
        scoped = kq.ask({"ask": "cache restart", "scope": [by_slug["ops-notes"]["id"]], "retrieval_only": True})
        assert {a["source"] for a in scoped.json()["output_json"]["artifacts"]} == {ops["hash"]}
        union = kq.ask({"ask": "cache restart", "scope": ["ops-notes", "knowledge"], "retrieval_only": True})
        assert len(union.json()["output_json"]["artifacts"]) == 2
        member = kq.client.get("/.well-known/agent-knowledge").json()["knowql"]
        assert member["version"] == "0.1.0" and member["endpoint"] == "https://localhost:8443/query"
        assert member["api_versions"] == ["2026-07", "unstable"]
        assert [c["slug"] for c in member["contexts"]] == ["knowledge", "ops-notes", "drafts"]


def test_turns_persist_in_the_data_directory(tmp_path) -> None:
    with knowql_app(tmp_path / "data") as kq:
        _world(kq)
        doc = kq.ask({"ask": "cache restart", "scope": ["knowledge"]}).json()
        assert doc["status"] == "completed"
    assert (tmp_path / "data" / "knowql.sqlite3").exists()
    with knowql_app(tmp_path / "data") as kq:
        again = kq.client.get(f"/queries/{doc['id']}").json()
        assert again == doc


@pytest.mark.parametrize("header", ["unstable", "2026-07"])
def test_version_header_is_echoed_on_success_and_error(header) -> None:
    with knowql_app() as kq:
        ok = kq.ask({"ask": "x y z", "scope": ["knowledge"]}, headers={"X-Pinecone-Api-Version": header})
        assert ok.status_code == 200 and ok.headers["x-pinecone-api-version"] == header
        bad = kq.ask({"scope": ["knowledge"]}, headers={"X-Pinecone-Api-Version": header})
        assert bad.status_code == 400 and bad.headers["x-pinecone-api-version"] == header
        missing = kq.client.get("/queries/qry_nope", headers={"X-Pinecone-Api-Version": header})
        assert missing.status_code == 404 and missing.headers["x-pinecone-api-version"] == header


def test_a_backtracking_shape_pattern_is_matched_in_linear_time() -> None:
    """Python's ``re`` would take exponential time (holding the GIL) on this pattern; RE2 answers at once."""
    with knowql_app() as kq:
        _world(kq)
        shape = {"type": "object", "properties": {"answer": {"type": "string", "pattern": "^(?:[\\s\\S]|[\\s\\S])*Z$"}},
                 "required": ["answer"]}
        started = time.monotonic()
        doc = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "shape": shape}).json()
        assert time.monotonic() - started < 30  # exponential under backtracking: the answer is hundreds of chars
        assert doc["status"] == "failed" and "does not match" in doc["error"]
