"""Issue 11 over HTTP: ``POST /v1/kip`` parses strict I-JSON, answers deep and costly
commands with KIP errors (never a 500 or a logged traceback), keeps the worker
responsive while a query spends its CPU budget, and reads no package file after start."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.settings import defaults
from akrelay.store.memory import MemoryStore

from .test_http import JSON_HEADERS, ORIGIN, RESPONSE, VECTORS, _submit

HTTP_TESTS = str(Path(__file__).resolve().parents[1] / "http")
if HTTP_TESTS not in sys.path:
    sys.path.insert(0, HTTP_TESTS)

from relay_harness import start_relay  # noqa: E402
from kql.fixtures import Log  # noqa: E402
from kql.test_hardening import SHAPES, _nested_not  # noqa: E402


def _client(**settings) -> TestClient:
    relay = Relay(MemoryStore(), RelayConfig(origin=ORIGIN), clock=lambda: VECTORS["now"], cursor_secret=b"k" * 32)
    app = create_app(relay, defaults(write_rate=0.0, read_rate=0.0, **settings))
    return TestClient(app, raise_server_exceptions=False)


def _post(client: TestClient, body: bytes) -> httpx.Response:
    response = client.post("/v1/kip", content=body, headers=JSON_HEADERS)
    assert response.status_code < 500, response.text
    RESPONSE.validate(response.json())
    return response


def _no_traceback(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"kip": "2.0", "kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER"}]}', "duplicate member name"),
    (b'{"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER", "parameters": {"x": 1e400}}]}', "overflows"),
    (b'{"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER", "parameters": {"x": 9007199254740993}}]}',
     "outside"),
])
def test_kip_body_is_strict_ijson(caplog, body: bytes, reason: str) -> None:
    with _client() as client:
        response = _post(client, body)
        assert response.status_code == 400
        doc = response.json()
        assert doc["status"] == "failed" and doc["results"] == []
        assert doc["error"]["code"] == "InvalidRequestEnvelope" and reason in doc["error"]["message"]
    _no_traceback(caplog)


def test_deep_commands_and_bodies_get_kip_errors_without_a_traceback(caplog) -> None:
    with _client() as client:
        for shape, (size, build) in SHAPES.items():
            body = {"kip": "2.0", "operations": [{"language": "KQL", "command": build(size)}]}
            response = _post(client, json.dumps(body).encode())
            assert response.status_code == 200, shape
            assert response.json()["results"][0]["error"]["code"] == "ResourceExhausted", shape
        meta = "DESCRIBE ACCESS WITH " + "{a: " * 300 + "1" + "}" * 300
        response = _post(client, json.dumps({"kip": "2.0", "operations": [{"command": meta}]}).encode())
        assert response.json()["results"][0]["error"]["code"] == "ResourceExhausted"
        for depth, code in ((100, "ResourceExhausted"), (5000, "InvalidRequestEnvelope")):
            value = "[" * depth + "]" * depth
            body = ('{"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER", "parameters": {"p": %s}}]}'
                    % value).encode()
            response = _post(client, body)
            assert response.status_code == 400 and response.json()["error"]["code"] == code
    _no_traceback(caplog)


def test_kip_route_reads_no_package_file_after_start(monkeypatch, tmp_path) -> None:
    """The schema, grammars and schema package are loaded when the app is created."""
    import akrelay.kip.kql.grammar as grammar
    import akrelay.kip.package as package
    import akrelay.kip.runtime as runtime

    schema = tmp_path / "kip-request.schema.json"
    schema.write_bytes(runtime.REQUEST_SCHEMA.read_bytes())
    monkeypatch.setattr(runtime, "REQUEST_SCHEMA", schema)
    runtime.request_validator.cache_clear()
    grammar.parser.cache_clear()
    with _client() as client:
        schema.unlink()  # as a reinstall under a running relay would

        def gone(*args, **kwargs):
            raise FileNotFoundError("the installed package changed under the relay")

        monkeypatch.setattr(grammar, "grammar_text", gone)
        monkeypatch.setattr(package, "load_package", gone)
        monkeypatch.setattr(runtime, "load_package", gone)
        _submit(client, "original")
        body = {"kip": "2.0", "execution": {"mode": "independent"}, "operations": [
            {"command": "DESCRIBE PRIMER"},
            {"command": 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} }'}]}
        response = _post(client, json.dumps(body).encode())
        assert response.status_code == 200 and response.json()["status"] == "succeeded", response.text
        assert response.json()["results"][1]["result"]["row_count"] == 1
        bad = _post(client, b'{"kip": "2.0", "operations": []}')
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "InvalidRequestEnvelope"
    runtime.request_validator.cache_clear()
    grammar.parser.cache_clear()


def test_budget_option_reaches_the_runtime() -> None:
    with _client(kip_budget_ms=123) as client:
        body = {"kip": "2.0", "operations": [{"command": "DESCRIBE CAPABILITIES"}]}
        limits = _post(client, json.dumps(body).encode()).json()["results"][0]["result"]["limits"]
        assert limits["cpu_budget_ms"] == 123
    with _client(kip_budget_ms=0) as client:
        limits = _post(client, json.dumps(body).encode()).json()["results"][0]["result"]["limits"]
        assert limits["cpu_budget_ms"] is None


def test_kip_requests_use_their_own_few_threads(monkeypatch) -> None:
    """Queued KIP requests (one runs at a time) must not take the thread pool that search shares."""
    import anyio.to_thread

    import akrelay.http.kip as kip_route

    seen = []
    real = anyio.to_thread.run_sync

    async def spy(fn, *args, limiter=None, **kwargs):
        if getattr(fn, "__name__", "") == "handle":
            seen.append(limiter)
        return await real(fn, *args, limiter=limiter, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", spy)
    with _client() as client:
        body = json.dumps({"kip": "2.0", "operations": [{"command": "DESCRIBE PROTOCOL"}]}).encode()
        assert _post(client, body).status_code == 200
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].total_tokens == kip_route.KIP_THREADS


# ------------------------------------------------------------------ a real relay


def _prepared_data(tmp_path: Path) -> Path:
    """A relay data directory holding 8 capsules."""
    log = Log()
    for i in range(8):
        log.publish("alice", f"Capsule {i}", tags=["t"])
    return log.relay_data(tmp_path / "data", ORIGIN)


def test_served_relay_stays_responsive_while_a_query_spends_its_budget(tmp_path) -> None:
    served = start_relay(_prepared_data(tmp_path), extra=["--kip-budget-ms", "1500"])
    try:
        verify = served.ssl_context()
        kip_url = served.origin + "/v1/kip"
        heavy = {"kip": "2.0", "operations": [{"language": "KQL", "command": _nested_not(8)}]}
        outcome: dict = {}

        def run_heavy() -> None:
            outcome["response"] = httpx.post(kip_url, json=heavy, verify=verify, timeout=60)
            outcome["done"] = time.monotonic()

        worker = threading.Thread(target=run_heavy)
        started = time.monotonic()
        worker.start()
        time.sleep(0.4)  # the query is evaluating now
        answered = []
        for _ in range(3):
            response = httpx.get(served.origin + "/.well-known/agent-knowledge", verify=verify, timeout=10)
            assert response.status_code == 200
            answered.append(time.monotonic())
        worker.join(timeout=90)
        assert not worker.is_alive()
        # Every discovery GET was answered while the KIP query was still running.
        assert outcome["done"] > answered[-1] and outcome["done"] - started >= 1.0
        result = outcome["response"].json()["results"][0]
        assert outcome["response"].status_code == 200
        assert result["error"]["code"] == "ExecutionTimeout" and result["error"]["details"]["budget_ms"] == 1500

        regex = {"kip": "2.0", "operations": [{"language": "KQL", "parameters": {"s": "a" * 200},
                                               "command": 'FIND(?c) WHERE { ?c {type: "KnowledgeCapsule"} '
                                                          'FILTER(REGEX(:s, "^(a|a){1,27}c")) }'}]}
        response = httpx.post(kip_url, json=regex, verify=verify, timeout=30)
        assert response.status_code == 200 and response.json()["status"] == "succeeded"
        deep = {"kip": "2.0", "operations": [{"language": "KQL", "command": SHAPES["not"][1](300)}]}
        response = httpx.post(kip_url, json=deep, verify=verify, timeout=30)
        assert response.status_code == 200
        assert response.json()["results"][0]["error"]["code"] == "ResourceExhausted"
    finally:
        served.stop()
    assert "Traceback" not in served.log.read_text(errors="replace")
