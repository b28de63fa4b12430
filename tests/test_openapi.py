"""``/openapi.json``: a valid OpenAPI 3.1 document whose declared schemas match real responses.

Every operation in the document has a recipe below (a new route fails the test
until it gets one), every served route is in the document (the explorer's HTML
pages excepted), and each recipe's real response validates against the schema
the document declares for its status and media type.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from openapi_spec_validator import validate

from tests.knowql.kq_harness import knowql_app

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with knowql_app(tmp_path_factory.mktemp("openapi")) as kq:
        c = kq.corpus
        a = c.publish("alice", "Disk fills at night", "The backup job fills the disk.", tags=("ops",))
        kq.submit(a, c.assess("bob", a["hash"], "supports"))
        turn = kq.ask({"ask": "disk backup", "scope": ["knowledge"]}).json()
        kq.ids = {"capsule": a["hash"], "query": turn["id"], "session": turn["session_id"]}
        kq.publish_next = c.publish("carol", "Another", "Another statement.")
        kq.client.app.state.node.component("log").tlog.tick(force=True)  # a checkpoint covers seq 1
        yield kq


def recipes(kq) -> dict[str, tuple[str, str, dict, int]]:
    ids = kq.ids
    kip = {"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER"}]}
    return {
        "discovery": ("GET", "/.well-known/agent-knowledge", {}, 200),
        "submitEvent": ("POST", "/v1/knowledge/events", {"json": kq.publish_next}, 200),
        "getEvent": ("GET", f"/v1/knowledge/events/{ids['capsule']}", {}, 200),
        "query": ("GET", "/v1/knowledge/query?type=knowledge.publish&limit=1", {}, 200),
        "batch": ("POST", "/v1/knowledge/batch", {"json": {"hashes": [ids["capsule"], "A" * 43]}}, 200),
        # the initiator's first message over an empty set: everything, as an empty id list
        "reconcile": ("POST", "/v1/knowledge/reconcile", {"content": bytes([0x61, 0x00, 0x00, 0x02, 0x00]),
                                                          "headers": {"content-type": "application/octet-stream"}}, 200),
        "search": ("POST", "/v1/knowledge/search", {"json": {"text": "disk", "mode": "lexical"}}, 200),
        "kip": ("POST", "/v1/kip", {"json": kip}, 200),
        "knowqlQuery": ("POST", "/query", {"json": {"ask": "disk", "scope": ["knowledge"]}}, 200),
        "knowqlGetQuery": ("GET", f"/queries/{ids['query']}", {}, 200),
        "knowqlCancel": ("POST", f"/queries/{ids['query']}/cancel", {}, 200),
        "knowqlEvents": ("GET", f"/queries/{ids['query']}/events", {}, 200),
        "knowqlGetSession": ("GET", f"/sessions/{ids['session']}", {}, 200),
        "knowqlDeleteSession": ("DELETE", "/sessions/ses_missing", {}, 200),
        "knowqlModels": ("GET", "/models", {}, 200),
        "knowqlContexts": ("GET", "/contexts", {}, 200),
        "metrics": ("GET", "/metrics", {}, 200),
        "healthz": ("GET", "/healthz", {}, 200),
        "readyz": ("GET", "/readyz", {}, 200),
        "openapi": ("GET", "/openapi.json", {}, 200),
        "logCheckpoint": ("GET", "/v1/knowledge/checkpoint", {}, 200),
        "logEntries": ("GET", "/v1/knowledge/log?start=0&limit=2", {}, 200),
        "logInclusionProof": ("GET", "/v1/knowledge/proof/inclusion?seq=1", {}, 200),
        "logConsistencyProof": ("GET", "/v1/knowledge/proof/consistency?from=1", {}, 200),
        "logWitness": ("GET", "/v1/knowledge/witness/checkpoint?origin=nobody.example", {}, 404),
        "witnessAddCheckpoint": ("POST", "/v1/knowledge/witness/add-checkpoint",
                                 {"content": b"old 0\n\nnobody.example\n1\n" + b"A" * 43 + b"=\n\n\xe2\x80\x94 nobody.example AAAAAAAA\n"}, 404),
        "witnessAddCheckpoint 400": ("POST", "/v1/knowledge/witness/add-checkpoint", {"content": b"garbage"}, 400),
        "logInclusionProof 400": ("GET", "/v1/knowledge/proof/inclusion?seq=1&size=999999", {}, 400),
        "docs": ("GET", "/docs", {}, 200),
        # the push stream never ends by itself: its refusal is what a request/response test can read
        "stream": ("GET", "/v1/knowledge/stream?after_seq=99999999", {}, 400),
        # refusals are declared too: one per shared error shape
        "getEvent 404": ("GET", f"/v1/knowledge/events/{'A' * 43}", {}, 404),
        "query 400": ("GET", "/v1/knowledge/query?bogus=1", {}, 400),
        "knowqlGetQuery 404": ("GET", "/queries/qry_missing", {}, 404),
    }


def test_document_is_valid_openapi_3_1(served) -> None:
    doc = served.client.get("/openapi.json").json()
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    assert "agent-knowledge" in doc["info"]["description"]
    envelope = doc["paths"]["/v1/knowledge/events"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert envelope == {"$ref": "#/components/schemas/signedEnvelope"}


def test_packaged_schema_is_the_repository_schema() -> None:
    packaged = ROOT / "src" / "akrelay" / "data" / "agent-knowledge-1.0.schema.json"
    assert json.loads(packaged.read_text()) == json.loads((ROOT / "schemas" / "agent-knowledge-1.0.schema.json").read_text())


def _operations(doc):
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            yield path, method.upper(), op


def test_every_served_route_is_documented(served) -> None:
    doc = served.client.get("/openapi.json").json()
    documented = {(re.sub(r"\{(\w+)\}", "{}", p), m) for p, m, _ in _operations(doc)}
    served_routes = set()
    for route in served.client.app.routes:
        if route.path == "/" or route.path.startswith("/explorer"):
            continue
        # The ASGI ingest route takes every method and answers only POST (405 otherwise)
        methods = route.methods or {"POST"}
        for method in methods - {"OPTIONS", "HEAD"}:
            served_routes.add((re.sub(r"\{[^}]+\}", "{}", route.path), method))
    assert served_routes - documented == set() and documented - served_routes == set()


def test_real_responses_match_declared_schemas(served) -> None:
    doc = served.client.get("/openapi.json").json()
    table = recipes(served)
    operations = {op["operationId"]: (path, method, op) for path, method, op in _operations(doc)}
    assert set(operations) == {k for k in table if " " not in k}
    for name, (method, url, kwargs, status) in table.items():
        path, declared_method, op = operations[name.split(" ")[0]]
        assert method == declared_method
        response = served.client.request(method, url, **kwargs)
        assert response.status_code == status, (name, response.text[:300])
        declared = op["responses"][str(status)]
        media = response.headers["content-type"].split(";")[0].strip()
        assert media in declared["content"], (name, media)
        schema = declared["content"][media]["schema"]
        if media == "application/json":
            root = {"components": doc["components"], **schema}
            jsonschema.Draft202012Validator(root).validate(response.json())
        elif media == "application/octet-stream":  # a reconciliation message
            assert schema == {"type": "string", "format": "binary"} and response.content[:1] == b"\x61"
        else:
            assert schema == {"type": "string"} and isinstance(response.text, str)


def test_docs_page_lists_every_operation(served) -> None:
    doc = served.client.get("/openapi.json").json()
    page = served.client.get("/docs")
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    for _, _, op in _operations(doc):
        assert f'id="{op["operationId"]}"' in page.text
