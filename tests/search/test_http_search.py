"""``POST /v1/knowledge/search`` over the real app: discovery, vectors, every error path."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from agent_protocols.errors import AgentProtocolError
from agent_protocols.knowledge import validate_knowledge_discovery, validate_knowledge_search_response

HTTP_TESTS = str(Path(__file__).resolve().parents[1] / "http")
if HTTP_TESTS not in sys.path:
    sys.path.insert(0, HTTP_TESTS)

from relay_harness import FIXTURES, ORIGIN, VECTORS, error_of, relay_app  # noqa: E402

from akrelay.protocol.envelope import verify_envelope  # noqa: E402
from akrelay.protocol.errors import ProtocolError  # noqa: E402
from akrelay.protocol.query import query_matches  # noqa: E402
from akrelay.protocol.reads import parse_read_json, parse_search_request  # noqa: E402
from akrelay.protocol.records import check_search_candidates, validate_search_response  # noqa: E402
from akrelay.protocol.text import text_matches  # noqa: E402

HEADERS = {"content-type": "application/json"}
CASES = VECTORS["search_cases"]


def _envelope(name):
    return verify_envelope(json.dumps(FIXTURES[name]["envelope"], ensure_ascii=False).encode())


def _post(h, body, headers=HEADERS):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body, ensure_ascii=False)
    return h.client.post("/v1/knowledge/search", content=content, headers=headers)


def _load(h, accepted=(), hidden=()):
    for name in accepted:
        h.relay.store.commit(_envelope(name), h.clock.now)
    for name in hidden:
        h.relay.withhold(FIXTURES[name]["envelope"]["hash"])
    assert h.node.search.engine.wait_indexed(timeout=60)


def _apply(doc, changes):
    doc = copy.deepcopy(doc)
    for change in changes:
        *parents, last = change["path"].lstrip("/").split("/")
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key = int(last) if isinstance(target, list) else last
        if change["op"] == "set":
            target[key] = change["value"]
        else:
            del target[key]
    return doc


def _current_retraction(hit):
    event = hit.get("record", {}).get("envelope", {}).get("event", {})
    return event.get("type") == "knowledge.retract" and "license" in event.get("payload", {})


def sdk_validate(page, request_value):
    """The reference SDK's check. Its bundled schema is the earlier draft, whose
    retractions carry no ``license``; hits holding the current form are left out
    of its view (our own validator checks them in full)."""
    view = {**page, "result": [hit for hit in page["result"] if not _current_retraction(hit)]}
    validate_knowledge_search_response(view, request_value, ORIGIN)


def _rejected(response, request_value, changes):
    """Both our client check and the reference SDK refuse the response (the SDK
    only where the change is inside its view, see :func:`sdk_validate`)."""
    ours = theirs = False
    if any(c["path"].startswith("/result") for c in changes) and any(
            _current_retraction(h) for h in response["result"] if isinstance(h, dict)):
        theirs = True
    try:
        validate_search_response(response, parse_search_request(request_value, ("lexical",)), ORIGIN)
    except ProtocolError as exc:
        ours = exc.code == "invalid_response"
    try:
        sdk_validate(response, request_value)
    except AgentProtocolError as exc:
        theirs = exc.code == "invalid_response"
    return ours and theirs


def test_discovery_advertises_ranked_search():
    with relay_app(extensions=True) as h:
        doc = h.client.get("/.well-known/agent-knowledge").json()
        validate_knowledge_discovery(doc, ORIGIN)
        assert "ranked-search" in doc["features"]
        assert doc["search_modes"] == ["lexical"]
        assert doc["endpoints"]["search"] == ORIGIN + "/v1/knowledge/search"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_search_vector_case(case):
    with relay_app(extensions=True) as h:
        _load(h, case.get("accepted", []), case.get("hidden", []))
        before = (h.relay.checkpoint(), h.node.search.engine.index_seq())
        value = case.get("request")
        response = _post(h, case["raw_json"] if "raw_json" in case else value)
        assert (h.relay.checkpoint(), h.node.search.engine.index_seq()) == before  # reads change nothing
        if case["expected"] in ("invalid_request", "unsupported_search_mode"):
            # This relay advertises lexical only, and the mode is checked first.
            unadvertised = isinstance(value, dict) and isinstance(value.get("mode"), str) and value["mode"] != "lexical"
            expected = "unsupported_search_mode" if unadvertised else case["expected"]
            assert error_of(response) == (400, expected)
            return
        if value["mode"] != "lexical":  # a valid semantic/hybrid request: not offered here
            assert error_of(response) == (400, "unsupported_search_mode")
            return
        assert response.status_code == 200
        page = response.json()
        validate_search_response(page, parse_search_request(value, ("lexical",)), ORIGIN)
        sdk_validate(page, value)
        request = parse_search_request(value, ("lexical",))
        eligible = {FIXTURES[n]["envelope"]["hash"] for n in case.get("accepted", [])
                    if n not in case.get("hidden", [])
                    and query_matches(_envelope(n), request.filters) and text_matches(_envelope(n), request.terms)}
        hits = [hit["record"]["envelope"]["hash"] for hit in page["result"]]
        # The service-side guard: distinct eligible candidates, honest exhaustiveness.
        check_search_candidates(hits, eligible, request.limit, page["coverage"])
        assert page["coverage"]["exhaustive"] == (len(eligible) <= request.limit)
        if case["expected"] == "valid" and case.get("coverage", {"exhaustive": True})["exhaustive"]:
            assert set(hits) == set(case["result"])  # the vector's complete answer, in our order
        if case["expected"] == "invalid_response" and case.get("response_changes"):
            assert _rejected(_apply(page, case["response_changes"]), value, case["response_changes"])


def test_search_errors_and_framework_paths():
    with relay_app(extensions=True) as h:
        _load(h, ["text_publication"])
        assert error_of(_post(h, {"text": "alpha", "mode": "lexical"}, {"content-type": "text/plain"})) == (
            400, "invalid_request")
        assert error_of(_post(h, {"text": "alpha", "mode": "lexical"}, {})) == (400, "invalid_request")
        assert error_of(h.client.get("/v1/knowledge/search"))[1] == "invalid_request"
        assert error_of(_post(h, b"")) == (400, "invalid_request")
        assert error_of(_post(h, b"[1]")) == (400, "invalid_request")
        assert error_of(_post(h, '{"text":"alpha","mode":"lexical","limit":1,"limit":2}')) == (400, "invalid_request")
        assert error_of(_post(h, '{"text":"\\udc00","mode":"lexical"}')) == (400, "invalid_request")
        body = _post(h, {"text": "alpha", "mode": "semantic"}).json()
        assert body["error"]["code"] == "unsupported_search_mode" and body["error"]["data"] == {"modes": ["lexical"]}
        big = json.dumps({"text": "alpha", "mode": "lexical", "pad": "x" * (h.settings.max_envelope_bytes + 10)})
        assert error_of(_post(h, big)) == (413, "payload_too_large")
        ok = _post(h, {"text": "ALPHA", "mode": "lexical"})
        assert ok.status_code == 200 and ok.headers["content-type"].startswith("application/json")
        page = ok.json()
        assert page["index_seq"] == page["checkpoint"] == 1
        assert parse_read_json(ok.content)["result"][0]["record"]["seq"] == 1


def test_index_lag_is_visible_over_http():
    with relay_app(extensions=True) as h:
        _load(h, ["text_publication"])
        h.node.search.engine._indexer.stop()
        h.relay.store.commit(_envelope("text_regional"), h.clock.now)
        page = _post(h, {"text": "alpha", "mode": "lexical"}).json()
        sdk_validate(page, {"text": "alpha", "mode": "lexical"})
        assert page["coverage"] == {"exhaustive": False, "reasons": ["index_lag"]}
        assert page["index_seq"] == 1 < page["checkpoint"] == 2


def test_serve_settings_reach_the_search_service():
    with relay_app(extensions=True, search_candidates=7, search_timeout_ms=250, search_writer_threads=2) as h:
        _load(h, ["text_publication"])
        service = h.node.search.engine
        assert (service.budget.candidates, service.budget.seconds) == (7, 0.25)
        assert _post(h, {"text": "alpha", "mode": "lexical"}).json()["coverage"]["exhaustive"] is True
