"""The Merkle log over HTTP (issue 23): an independent RFC 9162 verifier checks what the relay serves.

The verifier is ``tests/rfc9162_naive.py`` (written from the RFC only); the
signature is checked with the discovery document's ``vkey``.
"""

from __future__ import annotations

import base64
import random
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest
import rfc9162_naive as naive
from litestar.testing import TestClient
from relay_harness import ORIGIN, error_of, fixture_bytes

from akrelay.process.worker import create_app
from akrelay.protocol.note import open_checkpoint, parse_vkey
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.settings import defaults
from akrelay.store.sqlite import SqliteStore
from store_contract import corpus


class Node:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.store = SqliteStore(data / "relay.sqlite3")
        from relay_harness import Clock, NOW

        self.relay = Relay(self.store, RelayConfig(origin=ORIGIN), clock=Clock(NOW), cursor_secret=b"k" * 32,
                           data_dir=data)
        self.app = create_app(self.relay, defaults(write_rate=0.0, read_rate=0.0), components=("log",))
        self.client = TestClient(self.app, raise_server_exceptions=False)
        self.client.__enter__()
        self.tlog = self.app.state.node.component("log").tlog

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.store.close()

    def vkey(self) -> str:
        return self.client.get("/.well-known/agent-knowledge").json()["log"]["vkey"]

    def checkpoint(self, force: bool = True) -> Any:
        if force:
            self.tlog.tick(force=True)
        response = self.client.get("/v1/knowledge/checkpoint")
        assert response.status_code == 200 and response.headers["content-type"] == "text/plain; charset=utf-8"
        cp, _ = open_checkpoint(response.text, parse_vkey(self.vkey()), origin="localhost:8443")
        return cp

    def entries(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self.client.get(f"/v1/knowledge/log?start={len(out)}&limit=7").json()
            out += page["entries"]
            if len(out) >= page["size"]:
                return out


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    n.close()


def _b64(text: str) -> bytes:
    return base64.b64decode(text)


def _entry(e: dict[str, Any]) -> bytes:
    return e["seq"].to_bytes(8, "big") + base64.urlsafe_b64decode(e["hash"] + "=")


def test_discovery_names_the_log(node: Node) -> None:
    doc = node.client.get("/.well-known/agent-knowledge").json()
    assert doc["log"]["checkpoint"] == ORIGIN + "/v1/knowledge/checkpoint"
    assert doc["log"]["origin"] == "localhost:8443"
    verifier = parse_vkey(doc["log"]["vkey"])
    assert verifier.name == "localhost:8443"
    assert (node.data / "log-key.pem").stat().st_mode & 0o777 == 0o600


def test_an_independent_verifier_checks_root_inclusion_and_consistency(node: Node) -> None:
    envs = corpus()
    node.store.commit_many([(env, 1) for env in envs[:25]])
    response = node.client.post("/v1/knowledge/events", content=fixture_bytes("original"),
                                headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.headers["akrelay-log-index"] == "25"
    first = node.checkpoint()
    assert first.size == 26
    entries = node.entries()
    assert [e["index"] for e in entries] == list(range(26))
    assert naive.MTH([_entry(e) for e in entries]) == first.root
    node.store.commit_many([(env, 2) for env in envs[25:]])
    second = node.checkpoint()
    entries = node.entries()
    data = [_entry(e) for e in entries]
    assert second.size == len(envs) + 1 and naive.MTH(data) == second.root
    rng = random.Random(5)
    for e in rng.sample(entries, 10):
        proof = node.client.get(f"/v1/knowledge/proof/inclusion?seq={e['seq']}").json()
        assert proof["index"] == e["index"] and proof["size"] == second.size
        hashes = [_b64(h) for h in proof["hashes"]]
        assert naive.verify_inclusion(e["index"], second.size, naive.H(b"\x00" + _entry(e)), hashes, second.root)
        old = node.client.get(f"/v1/knowledge/proof/inclusion?seq={e['seq']}&size={first.size}")
        if e["index"] < first.size:
            hashes = [_b64(h) for h in old.json()["hashes"]]
            assert naive.verify_inclusion(e["index"], first.size, naive.H(b"\x00" + _entry(e)), hashes, first.root)
        else:
            assert error_of(old) == (400, "invalid_request")
    proof = node.client.get(f"/v1/knowledge/proof/consistency?from={first.size}&to={second.size}").json()
    assert (proof["from"], proof["to"]) == (first.size, second.size)
    assert naive.verify_consistency(first.size, second.size, first.root, second.root, [_b64(h) for h in proof["hashes"]])
    default_to = node.client.get(f"/v1/knowledge/proof/consistency?from={first.size}").json()
    assert default_to["to"] == second.size


def test_withheld_records_stay_in_the_log(node: Node) -> None:
    envs = corpus()[:4]
    node.store.commit_many([(env, 1) for env in envs])
    node.relay.store.set_withheld(envs[2].id, True)
    entries = node.entries()
    assert [e["withheld"] for e in entries] == [False, False, True, False]
    assert naive.MTH([_entry(e) for e in entries]) == node.checkpoint().root


@pytest.mark.parametrize("url", [
    "/v1/knowledge/log?start=-1", "/v1/knowledge/log?start=abc", "/v1/knowledge/log?limit=0",
    "/v1/knowledge/log?limit=1001", "/v1/knowledge/log?start=99", "/v1/knowledge/log?start=1e3",
    "/v1/knowledge/log?start=99999999999999999999999", "/v1/knowledge/log?start=%ff",
    "/v1/knowledge/proof/inclusion", "/v1/knowledge/proof/inclusion?seq=x", "/v1/knowledge/proof/inclusion?seq=77",
    "/v1/knowledge/proof/inclusion?seq=1&size=4", "/v1/knowledge/proof/inclusion?seq=1&size=0",
    "/v1/knowledge/proof/inclusion?seq=0", "/v1/knowledge/proof/inclusion?seq=1&size=-3",
    "/v1/knowledge/proof/consistency", "/v1/knowledge/proof/consistency?from=3&to=2",
    "/v1/knowledge/proof/consistency?from=1&to=4", "/v1/knowledge/proof/consistency?from=9",
    "/v1/knowledge/proof/consistency?from=1&to=%20",
])
def test_bad_requests_are_clear_400s(node: Node, url: str) -> None:
    node.store.commit_many([(env, 1) for env in corpus()[:3]])
    node.checkpoint()
    response = node.client.get(url)
    assert error_of(response) == (400, "invalid_request"), response.text


def test_empty_log_has_a_signed_empty_checkpoint(node: Node) -> None:
    cp = node.checkpoint(force=False)
    assert cp.size == 0 and cp.root == naive.MTH([])
    assert node.client.get("/v1/knowledge/log").json() == {"entries": [], "size": 0}
    assert node.client.get("/v1/knowledge/proof/consistency?from=0&to=0").json()["hashes"] == []


def test_no_checkpoint_is_signed_over_a_rewritten_log(node: Node) -> None:
    envs = corpus()
    node.store.commit_many([(env, 1) for env in envs[:10]])
    good = node.checkpoint()
    conn = sqlite3.connect(node.data / "relay.sqlite3")  # an offline rewrite of an old entry and its subtree
    conn.execute("UPDATE log_entries SET hash = ? WHERE idx = 3", (b"\x07" * 32,))
    conn.execute("DELETE FROM log_nodes")
    conn.commit()
    conn.close()
    node.store._frontier = None
    node.store.commit_many([(env, 2) for env in envs[10:12]])
    assert node.tlog.tick(force=True) is None and node.tlog.inconsistent
    assert node.checkpoint(force=False) == good  # the last good one is still served


def test_a_store_restored_behind_the_last_checkpoint_is_refused(node: Node, tmp_path: Path) -> None:
    envs = corpus()
    node.store.commit_many([(env, 1) for env in envs[:5]])
    node.checkpoint()
    backup = tmp_path / "backup.sqlite3"
    node.store.backup(backup)
    node.store.commit_many([(env, 1) for env in envs[5:9]])
    assert node.checkpoint().size == 9
    node.close()
    backup.replace(node.data / "relay.sqlite3")  # restored: store and its meta copy are at size 5
    again = Node(node.data)
    try:
        again.store.commit_many([(env, 1) for env in envs[20:22]])  # different records at indices 5, 6
        assert again.tlog.tick(force=True) is None
        assert "data directory" in (again.tlog.inconsistent or "")
    finally:
        again.close()
    node.client.__enter__()  # the fixture closes it again
    node.store = SqliteStore(node.data / "relay.sqlite3")


def test_a_changed_log_key_is_a_clear_503_not_a_500(node: Node) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    node.store.commit_many([(env, 1) for env in corpus()[:3]])
    node.checkpoint()
    (node.data / "log-checkpoint").unlink()
    node.tlog.key = Ed25519PrivateKey.generate()  # what a replaced key file does after a restart
    from akrelay.protocol.note import parse_vkey, raw_public_key, vkey

    node.tlog.verifier = parse_vkey(vkey(node.tlog.name, raw_public_key(node.tlog.key.public_key())))
    for url in ("/v1/knowledge/checkpoint", "/v1/knowledge/proof/inclusion?seq=1"):
        response = node.client.get(url)
        assert error_of(response) == (503, "service_unavailable"), response.text


def test_the_witness_endpoint_serves_a_cosigned_peer_checkpoint(tmp_path: Path) -> None:
    from akrelay.federation.state import FederationState, PeerState

    from relay_harness import NOW, Clock

    state = FederationState.open_in(tmp_path)
    state.put(PeerState("https://peer-a.example", cosigned="peer-a.example\n1\nAAAA\n\n\u2014 x AAAAAAAA\n"))
    state.put(PeerState("https://peer-b.example", cosigned="b", misbehaving="a fork"))
    state.close()
    store = SqliteStore(tmp_path / "relay.sqlite3")
    relay = Relay(store, RelayConfig(origin=ORIGIN), clock=Clock(NOW), cursor_secret=b"k" * 32, data_dir=tmp_path)
    settings = defaults(write_rate=0.0, read_rate=0.0, data=str(tmp_path), peers=str(tmp_path / "peers.toml"))
    app = create_app(relay, settings, components=("log",))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            doc = client.get("/.well-known/agent-knowledge").json()
            assert doc["log"]["witness"]["vkey"].startswith("localhost:8443+")
            ok = client.get("/v1/knowledge/witness/checkpoint?origin=peer-a.example")
            assert ok.status_code == 200 and ok.text.startswith("peer-a.example\n1\n")
            for name in ("peer-b.example", "nobody", ""):
                response = client.get(f"/v1/knowledge/witness/checkpoint?origin={name}")
                assert error_of(response) == (404, "not_found")
    finally:
        store.close()
