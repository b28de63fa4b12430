"""Every endpoint and every error code over HTTP, through the real app and relay."""

from __future__ import annotations

import json

import pytest
from litestar import Response, get
from agent_protocols.knowledge import validate_knowledge_discovery, validate_knowledge_record
from relay_harness import FIXTURES, NOW, ORIGIN, error_of, fixture_bytes, fixture_dict, hash_of, relay_app

from akrelay.protocol.discovery import validate_discovery
from akrelay.protocol.errors import HTTP_STATUS
from akrelay.protocol.signer import Signer, publish_event
from akrelay.relay.config import RelayConfig

EVENTS = "/v1/knowledge/events"


# -- discovery (§9.2) --------------------------------------------------------------------------


def test_discovery_is_valid_for_its_origin_and_publishes_limits() -> None:
    with relay_app(max_envelope_bytes=1000, config=RelayConfig(origin=ORIGIN, max_envelope_bytes=1000)) as h:
        response = h.client.get("/.well-known/agent-knowledge")
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    doc = response.json()
    validate_discovery(doc, ORIGIN)
    validate_knowledge_discovery(doc, ORIGIN)  # the SDK agrees
    assert doc["service"] == ORIGIN
    assert doc["endpoints"] == {k: f"{ORIGIN}/v1/knowledge/{k}" for k in ("events", "query", "batch")}
    assert doc["limits"]["max_envelope_bytes"] == 1000
    assert all(type(v) is int and v > 0 for v in doc["limits"].values())
    # The core alone has no ranked search: no feature, no search endpoint, no modes.
    assert "ranked-search" not in doc.get("features", []) and "search" not in doc["endpoints"]
    assert "search_modes" not in doc


def test_discovery_with_every_installed_extension_stays_valid() -> None:
    with relay_app(extensions=True) as h:
        doc = h.client.get("/.well-known/agent-knowledge").json()
    validate_discovery(doc, ORIGIN)
    validate_knowledge_discovery(doc, ORIGIN)
    assert all(url.startswith(ORIGIN + "/") for url in doc["endpoints"].values())
    if "ranked-search" in doc.get("features", []):
        assert "search" in doc["endpoints"] and "lexical" in doc["search_modes"]


def test_discovery_for_another_origin_is_not_valid_here() -> None:
    with relay_app() as h:
        doc = h.client.get("/.well-known/agent-knowledge").json()
    with pytest.raises(Exception):
        validate_discovery(doc, "https://other.example")


def test_an_extra_component_plugs_in_routes_and_discovery() -> None:
    from akrelay.process.worker import create_app
    from litestar.testing import TestClient

    class Extra:
        name = "extra"
        options = ()

        def __init__(self, relay) -> None:
            self.relay = relay
            self.events: list[str] = []

        def routes(self):
            @get("/v1/knowledge/extra", sync_to_thread=False)
            def extra() -> Response[bytes]:
                return Response(content=b'{"ok":true}', media_type="application/json")
            return [extra]

        def discovery(self):
            return {"features": ["x-test"], "endpoints": {"extra": self.relay.config.origin + "/v1/knowledge/extra"}}

        def start(self) -> None:
            self.events.append("start")

        def stop(self) -> None:
            self.events.append("stop")

    with relay_app() as base:
        relay, settings = base.relay, base.settings
    component = Extra(relay)
    app = create_app(relay, settings, components=(), extra=[component])
    with TestClient(app) as client:
        assert component.events == ["start"]
        assert client.get("/v1/knowledge/extra").json() == {"ok": True}
        doc = client.get("/.well-known/agent-knowledge").json()
    assert component.events == ["start", "stop"]
    assert doc["features"] == ["x-test"] and doc["endpoints"]["extra"].endswith("/extra")
    assert doc["endpoints"]["events"] == ORIGIN + EVENTS
    validate_discovery(doc, ORIGIN)


# -- submission (§8.1) ----------------------------------------------------------------------


def test_submit_then_exact_resubmission_returns_the_original_record() -> None:
    with relay_app() as h:
        first = h.submit_fixture("original")
        assert first.status_code == 200
        record = first.json()
        validate_knowledge_record(record, hash_of("original"))
        assert record == {"envelope": fixture_dict("original"), "accepted_at": NOW, "seq": 1}
        h.clock.now += 60_000
        again = h.submit_fixture("original")
        assert again.status_code == 200 and again.content == first.content
        assert h.relay.checkpoint() == 1
        # Whitespace differences are the same envelope, not a new event.
        pretty = json.dumps(fixture_dict("original"), indent=2).encode()
        assert h.submit(pretty).json() == record


def test_missing_dependency_lists_sorted_ids_and_changes_nothing() -> None:
    with relay_app() as h:
        response = h.submit_fixture("merge")
        assert error_of(response) == (409, "missing_dependency")
        missing = response.json()["error"]["data"]["missing"]
        assert missing == sorted(missing) and len(missing) == len(set(missing)) >= 2
        assert h.relay.checkpoint() == 0
        assert h.query().json()["result"] == []


@pytest.mark.parametrize("fixture, code", [
    ("cross_author_supersedes", "invalid_target"),
    ("backwards_supersedes", "invalid_target"),
    ("cross_author_retract", "invalid_target"),
    ("retract_retraction", "invalid_target"),
])
def test_invalid_targets_are_rejected_without_state_change(fixture, code) -> None:
    deps = {"cross_author_supersedes": ["original"], "backwards_supersedes": ["original"],
            "cross_author_retract": ["original"], "retract_retraction": ["original", "retract_original"]}
    with relay_app() as h:
        for name in deps[fixture]:
            assert h.submit_fixture(name).status_code == 200
        before = h.relay.checkpoint()
        assert error_of(h.submit_fixture(fixture)) == (400, code)
        assert h.relay.checkpoint() == before


def test_future_created_at_is_out_of_window_but_old_events_are_accepted() -> None:
    with relay_app() as h:
        assert error_of(h.submit_fixture("future")) == (400, "timestamp_out_of_window")
        assert h.relay.checkpoint() == 0
        assert h.submit_fixture("old_event").status_code == 200
        h.clock.now += 1
        assert h.submit_fixture("future").json()["seq"] == 2


@pytest.mark.parametrize("body, code", [
    (b"{", "invalid_event"),
    (b"", "invalid_event"),
    (b"[]", "invalid_event"),
    (b'{"value":NaN}', "invalid_event"),
    (b"\xff\xfe{}", "invalid_event"),
    ('{"hash":"\udcff"}'.encode("utf-8", "surrogatepass"), "invalid_event"),
])
def test_malformed_bodies_are_invalid_event(body, code) -> None:
    with relay_app() as h:
        assert error_of(h.submit(body)) == (400, code)


def test_non_utf8_envelope_is_invalid_event() -> None:
    raw = json.dumps(fixture_dict("original"), ensure_ascii=False).encode("utf-8")
    latin = raw.decode("utf-8").encode("latin-1", "replace").replace(b"\"payload\"", b"\"payload\"") + b"\xe9"
    with relay_app() as h:
        assert error_of(h.submit(latin)) == (400, "invalid_event")
        assert error_of(h.submit(raw.replace(b"{", b"{\xc3\x28", 1))) == (400, "invalid_event")


def test_tampered_hash_and_signature() -> None:
    env = fixture_dict("original")
    env["event"]["payload"]["title"] = env["event"]["payload"]["title"] + "!"
    bad_sig = fixture_dict("original")
    bad_sig["signature"] = "A" * 86
    with relay_app() as h:
        assert error_of(h.submit(json.dumps(env))) == (400, "invalid_event_hash")
        assert error_of(h.submit(json.dumps(bad_sig))) == (400, "invalid_signature")
        assert h.relay.checkpoint() == 0


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/json; charset=latin-1", "multipart/form-data"])
def test_wrong_content_type_is_invalid_request(content_type) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    with relay_app() as h:
        response = h.client.post(EVENTS, content=fixture_bytes("original"), headers=headers)
        assert error_of(response) == (400, "invalid_request")
        assert error_of(h.client.post("/v1/knowledge/batch", content=b'{"hashes":[]}', headers=headers)) == (
            400, "invalid_request")
        assert h.relay.checkpoint() == 0


def test_json_content_type_with_utf8_charset_is_accepted() -> None:
    with relay_app() as h:
        response = h.submit(fixture_bytes("original"), headers={"content-type": "Application/JSON; charset=UTF-8"})
        assert response.status_code == 200


def test_oversized_body_is_payload_too_large_before_parsing() -> None:
    with relay_app(max_envelope_bytes=2048, config=RelayConfig(origin=ORIGIN, max_envelope_bytes=2048)) as h:
        big = b'{"pad":"' + b"x" * 4096 + b'"}'
        response = h.submit(big)
        assert error_of(response) == (413, "payload_too_large")
        # Streamed without Content-Length: still bounded while reading.
        def chunks():
            for _ in range(8):
                yield b"x" * 1024
        streamed = h.client.post(EVENTS, content=chunks(), headers=h.headers)
        assert error_of(streamed) == (413, "payload_too_large")
        assert error_of(h.batch(b'{"hashes":["' + b"A" * 3000 + b'"]}')) == (413, "payload_too_large")
        assert h.relay.checkpoint() == 0


def test_service_envelope_limit_applies_even_when_http_limit_is_larger() -> None:
    size = len(fixture_bytes("original"))
    with relay_app(config=RelayConfig(origin=ORIGIN, max_envelope_bytes=size - 1)) as h:
        response = h.submit_fixture("original")
        assert error_of(response) == (413, "payload_too_large")


def test_licence_allow_list_refusal_is_permission_denied() -> None:
    licence = FIXTURES["original"]["envelope"]["event"]["payload"]["license"]
    refuse = RelayConfig(origin=ORIGIN, licence_allowlist=frozenset({"https://example.org/only-this"}))
    with relay_app(config=refuse) as h:
        response = h.submit_fixture("original")
        assert error_of(response) == (403, "permission_denied")
        assert h.relay.checkpoint() == 0
    with relay_app(config=RelayConfig(origin=ORIGIN, licence_allowlist=frozenset({licence}))) as h:
        assert h.submit_fixture("original").status_code == 200


def test_legacy_retraction_switch() -> None:
    signer = Signer.from_seed(bytes([5]) * 32)
    payload = {"license": "https://creativecommons.org/licenses/by/4.0/", "kind": "observation", "title": "T",
               "statement": "S", "language": "en", "context": {"scope": "x", "conditions": [], "limitations": []},
               "basis": "B"}
    target = signer.sign(publish_event(signer.agent_id, NOW, 1, payload))
    from akrelay.protocol.signer import retract_event

    legacy = signer.sign(retract_event(signer.agent_id, NOW, 2, {"target": target["hash"], "reason": "wrong"}))
    from akrelay.protocol.options import ValidationOptions

    with relay_app() as h:
        assert h.submit(json.dumps(target)).status_code == 200
        assert h.submit(json.dumps(legacy)).status_code == 200
    strict = RelayConfig(origin=ORIGIN, options=ValidationOptions(allow_legacy_retract=False))
    with relay_app(config=strict) as h:
        assert h.submit(json.dumps(target)).status_code == 200
        assert error_of(h.submit(json.dumps(legacy))) == (400, "invalid_event")


# -- lookup ----------------------------------------------------------------------------------------


def test_lookup_found_absent_and_malformed() -> None:
    with relay_app() as h:
        h.submit_fixture("original")
        got = h.client.get(f"{EVENTS}/{hash_of('original')}")
        assert got.status_code == 200 and got.json()["envelope"] == fixture_dict("original")
        assert error_of(h.client.get(f"{EVENTS}/{hash_of('assessment')}")) == (404, "not_found")
        for bad in ("abc", "A" * 44, hash_of("original")[:-1] + "!", "x/y", "%ff"):
            assert error_of(h.client.get(f"{EVENTS}/{bad}")) == (400, "invalid_request"), bad


# -- withholding (§7.1) ---------------------------------------------------------------------


def test_withheld_event_in_lookup_query_batch_and_resubmission() -> None:
    with relay_app() as h:
        original = h.submit_fixture("original").json()
        h.submit_fixture("branch_left")
        h.relay.withhold(hash_of("original"))
        assert error_of(h.client.get(f"{EVENTS}/{hash_of('original')}")) == (404, "not_found")
        ids = [r["envelope"]["hash"] for r in h.query().json()["result"]]
        assert ids == [hash_of("branch_left")]
        batch = h.batch({"hashes": [hash_of("original"), hash_of("branch_left")]}).json()
        assert batch["missing"] == [hash_of("original")]
        assert [r["envelope"]["hash"] for r in batch["result"]] == [hash_of("branch_left")]
        # Exact resubmission returns the retained record and does not restore visibility.
        h.clock.now += 5000
        again = h.submit_fixture("original")
        assert again.status_code == 200 and again.json() == original
        assert error_of(h.client.get(f"{EVENTS}/{hash_of('original')}")) == (404, "not_found")
        # A dependent of a withheld event still resolves.
        assert h.submit_fixture("retract_original").status_code == 200
        h.relay.unwithhold(hash_of("original"))
        assert h.client.get(f"{EVENTS}/{hash_of('original')}").json()["seq"] == 1


# -- query (§9.3) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("qs", [
    "unknown=1", "kind=claim&kind=claim", "limit=0", "limit=1001", "limit=+5", "limit=1e2", "limit=%EF%BC%91",
    "after_seq=-1", "after_seq=0x10", "created_from=5&created_before=5", "q=", "q=%20%20", "type=knowledge.nope",
    "actor=nobody", "target=abc", "q=%ff", "language=", "cursor=", "after_seq=1",
])
def test_query_strict_parsing_is_invalid_request(qs) -> None:
    with relay_app() as h:
        assert error_of(h.query(qs)) == (400, "invalid_request"), qs


def test_too_many_query_parameters_is_invalid_request() -> None:
    with relay_app() as h:
        assert error_of(h.query("&".join(f"tag=t{i}" for i in range(100)))) == (400, "invalid_request")


def test_query_pages_are_complete_with_frozen_checkpoint() -> None:
    names = ["original", "branch_left", "branch_right", "merge", "assessment", "retract_original"]
    with relay_app() as h:
        for name in names:
            assert h.submit_fixture(name).status_code == 200
        seen, cursor, firsts = [], None, None
        while True:
            pairs = [("limit", "2")] + ([("cursor", cursor)] if cursor else [])
            page = h.query(pairs).json()
            firsts = firsts or (page["checkpoint"], page["as_of"], page["service"])
            assert (page["checkpoint"], page["as_of"], page["service"]) == firsts
            seen += [r["envelope"]["hash"] for r in page["result"]]
            h.clock.now += 1000
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        assert seen == [hash_of(n) for n in names] and firsts == (6, NOW, ORIGIN)
        # after_seq polling: equal to the checkpoint is empty; larger is invalid_request.
        assert h.query([("after_seq", "6")]).json()["result"] == []
        assert [r["seq"] for r in h.query([("after_seq", "4")]).json()["result"]] == [5, 6]
        assert error_of(h.query([("after_seq", "7")])) == (400, "invalid_request")


def test_cursor_tampering_is_invalid_cursor() -> None:
    with relay_app() as h:
        for name in ("original", "branch_left", "branch_right"):
            h.submit_fixture(name)
        cursor = h.query([("limit", "1")]).json()["next_cursor"]
        flipped = cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1]
        cases = [
            [("limit", "1"), ("cursor", flipped)],                     # forged
            [("limit", "1"), ("cursor", cursor[:10])],                 # truncated
            [("limit", "1"), ("cursor", "not a cursor!")],             # malformed
            [("limit", "2"), ("cursor", cursor)],                      # different limit
            [("limit", "1"), ("type", "knowledge.publish"), ("cursor", cursor)],  # different filters
            [("cursor", cursor)],                                      # effective limit differs (100)
        ]
        for pairs in cases:
            assert error_of(h.query(pairs)) == (400, "invalid_cursor"), pairs
        # Parameter order does not matter.
        assert h.query([("cursor", cursor), ("limit", "1")]).status_code == 200


def test_cursor_from_another_relay_secret_is_invalid_cursor() -> None:
    with relay_app() as h:
        for name in ("original", "branch_left"):
            h.submit_fixture(name)
        cursor = h.query([("limit", "1")]).json()["next_cursor"]
    from akrelay.relay.core import Relay
    from akrelay.store.memory import MemoryStore

    with relay_app() as h2:
        for name in ("original", "branch_left"):
            h2.submit_fixture(name)
        h2.relay._cursors = Relay(MemoryStore(), cursor_secret=b"z" * 32)._cursors
        assert error_of(h2.query([("limit", "1"), ("cursor", cursor)])) == (400, "invalid_cursor")


def test_q_text_matching_over_http() -> None:
    with relay_app() as h:
        for name in ("text_publication", "text_regional", "text_assessment", "text_retraction"):
            assert h.submit_fixture(name).status_code == 200
        everything = h.query([("q", "alpha")]).json()["result"]
        assert len(everything) >= 1
        assert h.query([("q", "zzzz-not-there")]).json()["result"] == []


# -- batch (§9.4) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    b'{"hashes":[]}', b'{"hashes":["abc"]}', b'{"hashes":"x"}', b"{}", b'{"hashes":[],"x":1}', b"[1]", b"{",
    b'{"hashes":[],"hashes":[]}', b"\xff", b'{"hashes":[' + b",".join([b'"' + b"A" * 43 + b'"'] * 2) + b"]}",
])
def test_batch_bad_requests_are_invalid_request(body) -> None:
    with relay_app() as h:
        assert error_of(h.batch(body)) == (400, "invalid_request"), body


def test_batch_over_100_ids_is_invalid_request() -> None:
    import base64
    import hashlib

    ids = [base64.urlsafe_b64encode(hashlib.sha3_256(str(i).encode()).digest()).rstrip(b"=").decode() for i in range(101)]
    with relay_app() as h:
        assert error_of(h.batch({"hashes": ids})) == (400, "invalid_request")
        assert h.batch({"hashes": ids[:100]}).json()["missing"] == ids[:100]


# -- framework edges -----------------------------------------------------------------------------


def test_unknown_routes_and_methods_use_the_error_body() -> None:
    with relay_app() as h:
        assert error_of(h.client.get("/v1/knowledge/nothing")) == (404, "not_found")
        assert error_of(h.client.get("/v1/knowledge/search")) == (404, "not_found")
        assert error_of(h.client.put(EVENTS, content=b"{}")) == (405, "invalid_request")
        assert error_of(h.client.get("/v1/knowledge/batch")) == (405, "invalid_request")


def test_a_genuine_bug_is_a_logged_500_not_a_crash(caplog) -> None:
    with relay_app() as h:
        def boom(*a, **k):
            raise RuntimeError("bug")
        h.relay.get = boom  # type: ignore[method-assign]
        response = h.client.get(f"{EVENTS}/{hash_of('original')}")
        assert response.status_code == 500 and response.json()["error"]["code"] == "internal_error"
    assert any("unhandled error" in r.message for r in caplog.records)


# -- rate limits (local admission) -----------------------------------------------------------


def test_write_rate_limit_is_429_with_retry_after_and_changes_nothing() -> None:
    with relay_app(write_rate=0.5, write_burst=2, read_rate=0.0) as h:
        assert h.submit_fixture("original").status_code == 200
        assert h.submit_fixture("branch_left").status_code == 200
        refused = h.submit_fixture("branch_right")
        assert error_of(refused) == (429, "rate_limited")
        assert int(refused.headers["retry-after"]) >= 1
        assert h.relay.checkpoint() == 2
        # Reads have their own bucket and are unaffected.
        assert h.client.get(f"{EVENTS}/{hash_of('original')}").status_code == 200
        assert h.query().status_code == 200


def test_read_rate_limit_covers_lookup_query_batch_and_discovery() -> None:
    with relay_app(read_rate=0.5, read_burst=1) as h:
        assert h.query().status_code == 200
        for refused in (h.query(), h.client.get("/.well-known/agent-knowledge"),
                        h.batch({"hashes": [hash_of("original")]}), h.client.get(f"{EVENTS}/{hash_of('original')}")):
            assert error_of(refused) == (429, "rate_limited")
            assert int(refused.headers["retry-after"]) >= 1
        # Writes are a separate bucket (disabled here).
        assert h.submit_fixture("original").status_code == 200


def test_zero_rates_disable_limits() -> None:
    with relay_app(write_rate=0.0, read_rate=0.0, write_burst=1, read_burst=1) as h:
        assert all(h.query().status_code == 200 for _ in range(20))
        assert all(h.submit_fixture("original").status_code == 200 for _ in range(5))


# -- bad input never reaches the catch-all --------------------------------------------------------

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402


def _mutations():
    base = fixture_bytes("original")
    return st.one_of(
        st.binary(max_size=600),
        st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.integers(0, len(base) - 1).flatmap(
            lambda i: st.binary(min_size=1, max_size=3).map(lambda b: base[:i] + b + base[i + 1:])),
        st.integers(1, len(base)).map(lambda i: base[:i]),
    )


@pytest.fixture(scope="module")
def shared_app():
    with relay_app() as h:
        h.submit_fixture("original")
        yield h


@hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_mutations(), path=st.sampled_from(["/v1/knowledge/events", "/v1/knowledge/batch"]),
       query=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_=&%0123456789+ ", max_size=40))
def test_fuzzed_requests_get_spec_errors_never_500(shared_app, body, path, query) -> None:
    h = shared_app
    if True:
        posted = h.client.post(path, content=body, headers=h.headers)
        assert posted.status_code != 500, posted.text
        if posted.status_code != 200:
            status, code = error_of(posted)
            assert status == HTTP_STATUS[code]
        got = h.client.get("/v1/knowledge/query?" + query)
        assert got.status_code != 500, (query, got.text)
        if got.status_code != 200:
            status, code = error_of(got)
            assert code in ("invalid_request", "invalid_cursor")


def test_core_only_serves_no_extension_routes_or_members() -> None:
    with relay_app(extensions=True, core_only=True) as h:
        doc = h.client.get("/.well-known/agent-knowledge").json()
        assert error_of(h.client.post("/v1/knowledge/search", content=b"{}", headers=h.headers))[0] in (404, 405)
    assert set(doc) <= {"protocol", "service", "endpoints", "limits"}
