"""The normative vector cases that need a service, run against the HTTP API.

Acceptance (including acceptance without a live-write window, missing and
invalid targets), pagination and ``after_seq`` polling, batch partitions and
discovery. Service-side cases go over HTTP; ``invalid_response`` cases mutate a
real HTTP response and must be caught by :class:`akrelay.client.RelayClient`.
"""

from __future__ import annotations

from vector_mutations import apply_changes  # noqa: F401  (re-exported for the tests here)

import json
from typing import Any

import httpx
import pytest
from backends import Opener, params
from relay_harness import FIXTURES, ORIGIN, VECTORS, error_of, fixture_dict, hash_of, relay_app

from akrelay.client import RelayClient, ResponseError

NAMES = {f["envelope"]["hash"]: name for name, f in FIXTURES.items()}


def ids(name_list: list[str]) -> list[str]:
    return [hash_of(n) for n in name_list]


@pytest.fixture(params=params(without=("sqlite",)))  # SQLite: through the service suite, and serve's own tests
def vector_store(request: pytest.FixtureRequest, tmp_path):
    """Stores the service vectors run over through HTTP: in memory, and a real Redis log (issue 15: same semantics)."""
    return Opener(request.param, request, tmp_path).log_stores(same=True)


def client_over(h, mutate=None) -> RelayClient:
    """A RelayClient whose requests go to the in-process app, optionally mutating JSON answers."""
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        answer = h.client.request(request.method, path, content=request.content,
                                  headers={"content-type": request.headers.get("content-type", "application/json")})
        body = answer.content
        if mutate is not None and answer.status_code == 200 and not path.startswith("/.well-known"):
            body = json.dumps(mutate(json.loads(body))).encode()
        return httpx.Response(answer.status_code, content=body, headers={"content-type": "application/json"})

    return RelayClient(ORIGIN, transport=httpx.MockTransport(handler))


# -- acceptance ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", VECTORS["acceptance_cases"], ids=lambda c: c["name"])
def test_acceptance_case_over_http(case, vector_store) -> None:
    with relay_app(store=vector_store()) as h:
        originals: dict[str, Any] = {}
        for step in case["steps"]:
            if "withhold" in step:
                h.relay.withhold(hash_of(step["withhold"]))
                continue
            h.clock.now = step["now"]
            response = h.submit_fixture(step["fixture"])
            expected = step["expected"]
            if expected == "accepted":
                assert response.status_code == 200, response.text
                record = response.json()
                assert record["seq"] == step["seq"] and record["accepted_at"] == step["now"]
                assert record["envelope"] == fixture_dict(step["fixture"])
                originals[step["fixture"]] = record
            elif expected == "resubmission":
                assert response.status_code == 200
                assert response.json() == originals[step["fixture"]]
            else:
                status, code = error_of(response)
                assert code == expected, (step, response.text)
                if code == "missing_dependency":
                    missing = response.json()["error"]["data"]["missing"]
                    assert missing == sorted(set(missing))
            # The checkpoint equals the step's seq: rejections change nothing.
            assert h.query([("limit", "1000")]).json()["checkpoint"] == step["seq"]


# -- pagination and after_seq polling -----------------------------------------------------------


def _service_steps(case) -> bool:
    return all("response_changes" not in s for s in case["steps"])


@pytest.mark.parametrize("case", [c for c in VECTORS["pagination_cases"] if _service_steps(c)], ids=lambda c: c["name"])
def test_pagination_case_over_http(case, vector_store) -> None:
    with relay_app(store=vector_store()) as h:
        for name in case["accepted"]:
            assert h.submit_fixture(name).status_code == 200, name
        for name in case.get("hidden") or []:
            h.relay.withhold(hash_of(name))
        cursor = None
        checkpoint = None
        for step in case["steps"]:
            for name in step.get("add", []):
                assert h.submit_fixture(name).status_code == 200
            for name in step.get("hide", []):
                h.relay.withhold(hash_of(name))
            h.clock.now += step.get("advance_ms", 0)
            pairs = [tuple(p) for p in step["parameters"]]
            if step.get("continue"):
                pairs.append(("cursor", cursor))
            response = h.query(pairs)
            if step["expected"] != "valid":
                assert error_of(response) == (400, step["expected"])
                continue
            assert response.status_code == 200, response.text
            page = response.json()
            assert [NAMES[r["envelope"]["hash"]] for r in page["result"]] == step["matches"]
            assert ("next_cursor" in page) == step["more"]
            assert page["service"] == ORIGIN
            if step.get("continue"):
                assert page["checkpoint"] == checkpoint
            checkpoint = page["checkpoint"]
            cursor = page.get("next_cursor")


@pytest.mark.parametrize("case", [c for c in VECTORS["pagination_cases"] if not _service_steps(c)],
                         ids=lambda c: c["name"])
def test_pagination_response_defects_are_caught_by_the_client(case) -> None:
    with relay_app() as h:
        for name in case["accepted"]:
            h.submit_fixture(name)
        steps = case["steps"]
        target = next(i for i, s in enumerate(steps) if "response_changes" in s)
        calls = {"n": 0}

        def mutate(page):
            calls["n"] += 1
            if calls["n"] - 1 == target:
                return apply_changes(page, steps[target]["response_changes"])
            return page

        client = client_over(h, mutate)
        params = [tuple(p) for p in steps[0]["parameters"]]
        with pytest.raises(ResponseError):
            for _ in client.query_pages(params):
                pass


# -- batch ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", VECTORS["batch_cases"], ids=lambda c: c["name"])
def test_batch_case_over_http(case, vector_store) -> None:
    with relay_app(store=vector_store()) as h:
        for name in case["accepted"]:
            assert h.submit_fixture(name).status_code == 200
        for name in case.get("hidden") or []:
            h.relay.withhold(hash_of(name))
        body = case["raw_json"].encode() if "raw_json" in case else json.dumps(case["request"]).encode()
        if case["expected"] == "invalid_request":
            assert error_of(h.batch(body)) == (400, "invalid_request")
            return
        if case["expected"] == "valid":
            response = h.batch(body)
            assert response.status_code == 200
            page = response.json()
            assert [r["envelope"]["hash"] for r in page["result"]] == case["result"]
            assert page["missing"] == case["missing"]
            assert page["service"] == ORIGIN and "next_cursor" not in page
            assert all(r["seq"] <= page["checkpoint"] for r in page["result"])
            # Our client accepts what our server sends.
            assert client_over(h).batch(case["request"]["hashes"])["missing"] == case["missing"]
            return
        assert case["expected"] == "invalid_response"
        client = client_over(h, lambda page: apply_changes(page, case["response_changes"]))
        with pytest.raises(ResponseError):
            client.batch(case["request"]["hashes"])


# -- discovery ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", VECTORS["discovery_cases"], ids=lambda c: c["name"])
def test_discovery_case_through_the_client(case) -> None:
    origin = case.get("origin", "https://knowledge.example.com")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(case["document"]).encode())

    if case["expected"] == "valid":
        client = RelayClient(origin, transport=httpx.MockTransport(handler))
        assert client.ensure_discovery() == case["document"]
    else:
        with pytest.raises(ResponseError):
            RelayClient(origin, transport=httpx.MockTransport(handler)).ensure_discovery()


def test_client_verifies_envelopes_and_refuses_foreign_service() -> None:
    with relay_app() as h:
        h.submit_fixture("original")
        h.submit_fixture("branch_left")
        good = client_over(h)
        assert good.get(hash_of("original"))["seq"] == 1
        assert good.query().records[0]["envelope"]["hash"] == hash_of("original")

        def swap(record):
            if "envelope" in record:
                record["envelope"]["signature"] = "A" * 86
            return record
        with pytest.raises(ResponseError, match="does not verify"):
            client_over(h, swap).get(hash_of("original"))

        def foreign(page):
            page["service"] = "https://other.example"
            return page
        with pytest.raises(ResponseError, match="differs"):
            client_over(h, foreign).query()

        def other_record(record):
            return h.client.get("/v1/knowledge/events/" + hash_of("branch_left")).json()
        with pytest.raises(ResponseError, match="asked for"):
            client_over(h, other_record).get(hash_of("original"))
