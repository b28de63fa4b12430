"""``POST /v1/kip`` through the real app over a real relay, and the discovery member."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay, open_relay
from akrelay.settings import defaults
from akrelay.store.memory import MemoryStore

from .conftest import vector_fixtures

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "agent-knowledge-1.0.vectors.json").read_text())
RESPONSE = jsonschema.Draft202012Validator(
    json.loads((Path(__file__).resolve().parent / "schemas" / "kip-response.schema.json").read_text()))
ORIGIN = "https://localhost:8443"
JSON_HEADERS = {"content-type": "application/json"}


def _client(relay: Relay) -> TestClient:
    return TestClient(create_app(relay, defaults(write_rate=0.0, read_rate=0.0)), raise_server_exceptions=False)


def _submit(client: TestClient, *names: str) -> None:
    fixtures = vector_fixtures()
    for name in names:
        r = client.post("/v1/knowledge/events", content=json.dumps(fixtures[name]["envelope"]), headers=JSON_HEADERS)
        assert r.status_code == 200, r.text


def _kip(client: TestClient, *commands: str, **extra):
    ops = [{"command": c} for c in commands]
    body = {"kip": "2.0", "operations": ops, **extra}
    if len(ops) > 1:
        body["execution"] = {"mode": "independent"}
    r = client.post("/v1/kip", content=json.dumps(body), headers=JSON_HEADERS)
    RESPONSE.validate(r.json())
    return r


def test_kip_endpoint_reads_what_the_relay_accepted() -> None:
    relay = Relay(MemoryStore(), RelayConfig(origin=ORIGIN), clock=lambda: VECTORS["now"], cursor_secret=b"k" * 32)
    with _client(relay) as client:
        _submit(client, "original", "derivative")
        r = _kip(client, "DESCRIBE SPACE")
        assert r.status_code == 200
        body = r.json()
        assert body["results"][0]["result"]["space_seq"] == 2 and body["snapshot"]["snapshot_seq"] == 2
        assert body["context"]["space_id"] == "akrelay:localhost:8443"
        _submit(client, "assessment")  # accepted after the first KIP read: the next read sees it
        hits = _kip(client, 'SEARCH EVIDENCE "knowledge.assess" THRESHOLD 1').json()["results"][0]["result"]["hits"]
        assert [h["id"] for h in hits] == ["e3.1"]
        relay.withhold(VECTORS["fixtures"]["assessment"]["envelope"]["hash"])  # operator moderation
        hits = _kip(client, 'SEARCH EVIDENCE "knowledge.assess" THRESHOLD 1').json()["results"][0]["result"]["hits"]
        assert hits == []
        relay.unwithhold(VECTORS["fixtures"]["assessment"]["envelope"]["hash"])
        refused = _kip(client, 'CREATE CONCEPT ?x {type: "Agent"}').json()
        assert refused["status"] == "failed" and refused["results"][0]["error"]["code"] == "ReadonlyViolation"
        doc = client.get("/.well-known/agent-knowledge").json()
        assert doc["kip"]["endpoint"] == ORIGIN + "/v1/kip"
        assert doc["kip"]["capabilities"]["historical_reads"] is True
        assert doc["kip"]["space_id"] == "akrelay:localhost:8443" and doc["protocol"] == "agent-knowledge/1.0"


def test_kip_endpoint_rejects_bad_bodies() -> None:
    relay = Relay(MemoryStore(), RelayConfig(origin=ORIGIN), clock=lambda: VECTORS["now"], cursor_secret=b"k" * 32)
    with _client(relay) as client:
        for body, headers in ((b"{not json", JSON_HEADERS), (b'{"kip":"2.0"}', JSON_HEADERS),
                              (b'{"kip":"2.0","operations":[{"command":"DESCRIBE PRIMER"}]}',
                               {"content-type": "text/plain"}), (b"NaN", JSON_HEADERS)):
            r = client.post("/v1/kip", content=body, headers=headers)
            assert r.status_code == 400
            RESPONSE.validate(r.json())
            assert r.json()["error"]["code"] == "InvalidRequestEnvelope"


def test_sqlite_relay_persists_the_nexus_across_restarts(tmp_path) -> None:
    relay = open_relay(tmp_path, RelayConfig(origin=ORIGIN), clock=lambda: VECTORS["now"])
    with _client(relay) as client:
        _submit(client, "original", "assessment")
        assert _kip(client, "DESCRIBE SNAPSHOT").json()["results"][0]["result"]["space_seq"] == 2
    relay.close()  # the app's lifespan stopped the KIP importer and the indexer; each batch is durable
    assert (tmp_path / "kip-nexus.sqlite3").is_file()
    relay = open_relay(tmp_path, RelayConfig(origin=ORIGIN), clock=lambda: VECTORS["now"])
    with _client(relay) as client:
        _submit(client, "retract_assessment")
        result = _kip(client, "DESCRIBE SNAPSHOT AS OF SEQ 2", "DESCRIBE SNAPSHOT").json()["results"]
        assert [r["result"]["space_seq"] for r in result] == [2, 3]
    relay.close()


def test_import_is_off_the_acceptance_path(monkeypatch) -> None:
    """Acceptance succeeds while the importer is broken; the nexus catches up afterwards."""
    import akrelay.kip.follower as follower_module

    relay = Relay(MemoryStore(), RelayConfig(origin=ORIGIN), clock=lambda: VECTORS["now"], cursor_secret=b"k" * 32)
    with _client(relay) as client:
        _submit(client, "original")
        assert _kip(client, "DESCRIBE SNAPSHOT").json()["results"][0]["result"]["space_seq"] == 1
        real = follower_module.import_record

        def broken(nexus, record):
            raise RuntimeError("importer down")

        monkeypatch.setattr(follower_module, "import_record", broken)
        _submit(client, "derivative", "assessment")   # acceptance does not wait for, or fail with, import
        assert relay.store.checkpoint() == 3
        monkeypatch.setattr(follower_module, "import_record", real)
        result = _kip(client, "DESCRIBE SNAPSHOT").json()["results"][0]["result"]
        assert result["space_seq"] == 3
