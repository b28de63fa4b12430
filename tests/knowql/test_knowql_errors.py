"""Every KnowQL 400, 404 and 409 path, each answered with the seed 000 §9.4 body and no row written."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .kq_harness import JSON_HEADERS, knowql_app

OK = {"ask": "cache restart", "scope": ["knowledge"]}


def _error(response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert response.headers["x-pinecone-api-version"] in ("2026-07", "unstable")
    return response.status_code, body["error"]["code"]


def _rows(kq) -> tuple[int, int]:
    store = kq.node.knowql.engine.store
    sessions = store._read("SELECT COUNT(*) FROM sessions", ())[0][0]
    queries = store._read("SELECT COUNT(*) FROM queries", ())[0][0]
    return sessions, queries


BAD_DOCUMENTS = [
    ({"scope": ["knowledge"]}, "ask is required"),
    ({"ask": None, "scope": ["knowledge"]}, "ask is required"),
    ({"ask": 7, "scope": ["knowledge"]}, "ask must be a string"),
    ({"ask": "   ", "scope": ["knowledge"]}, "ask must not be empty"),
    ({"ask": "x" * 4001, "scope": ["knowledge"]}, "longer than 4000"),
    ({"ask": "q"}, "scope is required"),
    ({"ask": "q", "scope": []}, "scope must have 1 to 10"),
    ({"ask": "q", "scope": [f"c{i}" for i in range(11)]}, "scope must have 1 to 10"),
    ({"ask": "q", "scope": "knowledge"}, "scope must be an array"),
    ({"ask": "q", "scope": [3]}, "every scope item"),
    ({**OK, "stream": True, "background": True}, "mutually exclusive"),
    ({**OK, "stream": "yes"}, "stream must be a boolean"),
    ({**OK, "background": 1}, "background must be a boolean"),
    ({**OK, "timeout_seconds": 0}, "at least 1"),
    ({**OK, "timeout_seconds": 1.5}, "timeout_seconds must be an integer"),
    ({**OK, "timeout_seconds": "30"}, "timeout_seconds must be an integer"),
    ({**OK, "max_retrieved": -1}, "at least 1"),
    ({**OK, "max_steps": True}, "max_steps must be an integer"),
    ({**OK, "shape": "Boolean!"}, "no shorthand"),
    ({**OK, "shape": {"type": "nonsense"}}, "not a valid JSON Schema"),
    ({**OK, "shape": {"type": "string"}}, "must describe a JSON object"),
    ({**OK, "shape": {"$ref": "https://example.com/s.json"}}, "local $ref"),
    ({**OK, "thinking_level": "extreme"}, "thinking_level must be one of"),
    ({**OK, "vars": {"policy": "mine"}}, "vars.policy"),
    ({**OK, "vars": {"policy": []}}, "vars.policy"),
    ({**OK, "vars": {"policy": {"a": 1}}}, "vars.policy"),
    ({**OK, "shape": {"type": "object", "properties": {"answer": {"type": "string", "pattern": "(a)\\1"}}}},
     "is not supported (RE2 syntax"),
    ({**OK, "shape": {"type": "object", "patternProperties": {"(?=x)": {}}}}, "is not supported (RE2 syntax"),
    ({**OK, "vars": []}, "vars must be an object"),
    ({**OK, "models": []}, "models must have 1 to 8"),
    ({**OK, "tools": "search"}, "tools must be an array"),
    ({**OK, "system_prompt": 5}, "system_prompt must be a string"),
    ({**OK, "session_id": 5}, "session_id must be a string"),
    ([OK], "must be a JSON object"),
]


@pytest.mark.parametrize("doc,message", BAD_DOCUMENTS, ids=[m for _, m in BAD_DOCUMENTS])
def test_invalid_documents_are_400_bad_request_and_write_nothing(doc, message) -> None:
    with knowql_app() as kq:
        r = kq.ask(doc)
        assert _error(r) == (400, "bad_request") and message in r.json()["error"]["message"]
        assert _rows(kq) == (0, 0)


def test_transport_level_400s() -> None:
    with knowql_app() as kq:
        assert _error(kq.ask(b"{not json"))[1] == "bad_request"
        assert _error(kq.ask(b'{"ask": NaN}'))[1] == "bad_request"
        assert _error(kq.ask(b"[" * 100_000 + b"]" * 100_000))[0] in (400, 413)
        r = kq.client.post("/query", content=json.dumps(OK), headers={"content-type": "text/plain"})
        assert _error(r) == (400, "bad_request")
        r = kq.client.post("/query", content=json.dumps(OK))
        assert _error(r) == (400, "bad_request")
        big = kq.client.post("/query", content=json.dumps({**OK, "pad": "x" * 300_000}), headers=JSON_HEADERS)
        # The app's shared body reader may answer this before the KnowQL route runs (no version header then).
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
        assert _rows(kq) == (0, 0)


def test_unsupported_api_version_is_400_on_every_route() -> None:
    with knowql_app() as kq:
        h = {"X-Pinecone-Api-Version": "2025-01"}
        for r in (kq.ask(OK, headers=h), kq.client.get("/models", headers=h), kq.client.get("/contexts", headers=h),
                  kq.client.get("/queries/qry_x", headers=h), kq.client.post("/queries/qry_x/cancel", headers=h),
                  kq.client.get("/queries/qry_x/events", headers=h), kq.client.get("/sessions/ses_x", headers=h),
                  kq.client.delete("/sessions/ses_x", headers=h)):
            assert _error(r) == (400, "unsupported_api_version")
        # The version is checked before the body.
        assert _error(kq.ask(b"junk", headers=h)) == (400, "unsupported_api_version")
        assert _rows(kq) == (0, 0)


def test_unknown_model_is_400_model_unavailable() -> None:
    with knowql_app() as kq:
        for extra in ({"model": "openai/gpt-9"}, {"models": ["lite", "nope/nope"]}):
            assert _error(kq.ask({**OK, **extra})) == (400, "model_unavailable")
        # 400 comes before 404: an unknown model with an unknown context is still 400.
        assert _error(kq.ask({"ask": "q", "scope": ["nowhere"], "model": "x"})) == (400, "model_unavailable")
        assert kq.ask({**OK, "model": "standard"}).status_code == 200
        assert kq.ask({**OK, "models": ["akrelay/extractive-1"]}).status_code == 200


def test_selectors_naming_different_sessions_are_400() -> None:
    with knowql_app() as kq:
        a = kq.ask(OK).json()
        b = kq.ask(OK).json()
        r = kq.ask({"ask": "q", "session_id": a["session_id"], "previous_query_id": b["id"]})
        assert _error(r) == (400, "bad_request")


def test_404_paths() -> None:
    with knowql_app() as kq:
        assert _error(kq.ask({"ask": "q", "scope": ["knowledge", "nowhere"]})) == (404, "context_not_found")
        assert _error(kq.ask({"ask": "q", "session_id": "ses_nope"})) == (404, "session_not_found")
        assert _error(kq.ask({"ask": "q", "previous_query_id": "qry_nope"})) == (404, "query_not_found")
        assert _rows(kq) == (0, 0)
        assert _error(kq.client.get("/queries/qry_nope")) == (404, "query_not_found")
        assert _error(kq.client.post("/queries/qry_nope/cancel")) == (404, "query_not_found")
        assert _error(kq.client.get("/queries/qry_nope/events")) == (404, "query_not_found")
        assert _error(kq.client.get("/sessions/ses_nope")) == (404, "session_not_found")
        # A deleted session's queries cannot be continued either.
        doc = kq.ask(OK).json()
        kq.client.delete(f"/sessions/{doc['session_id']}")
        assert _error(kq.ask({"ask": "q", "session_id": doc["session_id"]})) == (404, "session_not_found")
        assert _error(kq.ask({"ask": "q", "previous_query_id": doc["id"]})) == (404, "query_not_found")


def test_409_context_not_queryable(tmp_path) -> None:
    contexts = tmp_path / "contexts.json"
    contexts.write_text(json.dumps({"contexts": [{"slug": "drafts", "name": "Drafts", "queryable": False}]}))
    with knowql_app(knowql_contexts=str(contexts)) as kq:
        assert _error(kq.ask({"ask": "q", "scope": ["knowledge", "drafts"]})) == (409, "context_not_queryable")
        # 404 before 409: an unknown context in the same scope wins.
        assert _error(kq.ask({"ask": "q", "scope": ["drafts", "nowhere"]})) == (404, "context_not_found")
        assert _rows(kq) == (0, 0)


def test_409_session_busy(slow) -> None:
    with knowql_app() as kq:
        doc = kq.ask({**OK, "background": True, "models": ["test/slow"]}).json()
        assert slow.entered.wait(60)
        for selector in ({"session_id": doc["session_id"]}, {"previous_query_id": doc["id"]}):
            assert _error(kq.ask({"ask": "q", **selector})) == (409, "session_busy")
        assert _rows(kq) == (1, 1)
        slow.gate.set()


# ---- property: random documents and wrong types never give a 5xx ---------------------------------

FIELDS = ["ask", "scope", "session_id", "previous_query_id", "workflow", "system_prompt", "guardrails", "vars",
          "shape", "model", "models", "tools", "stream", "background", "timeout_seconds", "max_steps",
          "thinking_level", "compose", "retrieval_only", "pointers_only", "chunks_only", "artifacts_only",
          "max_retrieved", "max_retrieved_chars", "comparison_group", "where", "budget", "unknown"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
FIELD_VALUES = {
    "ask": st.text(max_size=60) | JSON_VALUES,
    "scope": st.lists(st.sampled_from(["knowledge", "nowhere", "", "KNOWLEDGE"]), max_size=12) | JSON_VALUES,
    "shape": st.sampled_from([{"type": "object"}, {"type": "object", "required": ["answer"],
                                                    "properties": {"answer": {"type": "string"}}},
                              {"type": "array"}, {"properties": 5}, {"type": "object", "required": ["x"]}])
    | JSON_VALUES,
    "model": st.sampled_from(["lite", "pro", "akrelay/extractive-1", "x"]) | JSON_VALUES,
}


@st.composite
def documents(draw):
    doc = {"ask": draw(st.text(min_size=1, max_size=40)), "scope": ["knowledge"]}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        doc[name] = draw(FIELD_VALUES.get(name, JSON_VALUES))
    if draw(st.booleans()):
        doc.pop("stream", None)
        doc["background"] = False
    return doc


def test_random_documents_never_give_a_5xx() -> None:
    with knowql_app() as kq:
        c = kq.corpus
        kq.submit(c.publish("alice", "Cache restart", "Restarting clears the cache."))
        seed = kq.ask(OK).json()

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(doc=documents() | JSON_VALUES, selector=st.sampled_from([None, "session", "previous"]))
        def check(doc, selector):
            if isinstance(doc, dict) and selector == "session":
                doc = {**doc, "session_id": seed["session_id"]}
            elif isinstance(doc, dict) and selector == "previous":
                doc = {**doc, "previous_query_id": seed["id"]}
            if isinstance(doc, dict) and doc.get("background") is True:
                doc["background"] = False  # keep the session free for the next example
            if isinstance(doc, dict) and doc.get("timeout_seconds") is not None:
                doc["timeout_seconds"] = 900 if isinstance(doc["timeout_seconds"], int) else doc["timeout_seconds"]
            r = kq.ask(doc)
            assert r.status_code < 500, r.text
            assert r.status_code in (200, 400, 404, 409), r.text
            assert r.headers["x-pinecone-api-version"] == "2026-07"
            if r.status_code >= 400:
                _error(r)

        check()


def test_unpaired_surrogates_anywhere_are_400() -> None:
    with knowql_app() as kq:
        for member in ('"ask": "\\ud800"', '"vars": {"\\udfff": 1}', '"shape": {"title": "\\ud800"}',
                       '"tools": ["\\ud800"]', '"system_prompt": "x\\udc00"'):
            body = '{"ask": "q", "scope": ["knowledge"], ' + member + "}"
            r = kq.ask(body.replace('"ask": "q", ', "") if member.startswith('"ask"') else body)
            assert _error(r) == (400, "bad_request"), (member, r.text)
        assert _rows(kq) == (0, 0)


def test_a_superscript_last_event_id_is_not_a_500() -> None:
    """``"²".isdigit()`` is true but ``int("²")`` fails: the replay starts from the beginning instead."""
    import anyio

    with knowql_app() as kq:
        doc = kq.ask(OK).json()
        sent: list[dict] = []
        scope = {"type": "http", "method": "GET", "path": f"/queries/{doc['id']}/events", "raw_path":
                 f"/queries/{doc['id']}/events".encode(), "query_string": b"", "headers": [
                     (b"host", b"localhost"), (b"last-event-id", b"\xb2")], "http_version": "1.1",
                 "scheme": "https", "server": ("127.0.0.1", 443), "client": ("127.0.0.1", 5000), "root_path": "",
                 "state": {}}

        calls = [0]

        async def receive() -> dict:
            calls[0] += 1
            if calls[0] > 1:  # the stream waits for a disconnect: give it the replay's time first
                await anyio.sleep(5)
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        with kq.client.portal() as portal:
            portal.call(kq.client.app, scope, receive, send)
        statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
        assert statuses == [200], statuses
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        assert b"event: query" in body  # the whole replay, ending with the query frame


def test_a_turn_cut_off_by_shutdown_is_failed_and_frees_its_session(slow, tmp_path) -> None:
    """Without this, a restart left the session busy (409) until the turn's deadline (900 s by default)."""
    with knowql_app(tmp_path) as kq:
        doc = kq.ask({**OK, "background": True, "models": ["test/slow"]}).json()
        assert slow.entered.wait(60)
        kq.node.knowql.engine.close(timeout=0.2)  # the turn is still blocked in its composer
        slow.gate.set()
    with knowql_app(tmp_path) as kq:
        after = kq.client.get(f"/queries/{doc['id']}").json()
        assert after["status"] == "failed" and "shut down" in after["error"]
        again = kq.ask({"ask": "q", "session_id": doc["session_id"]})
        assert again.status_code == 200, again.json()
