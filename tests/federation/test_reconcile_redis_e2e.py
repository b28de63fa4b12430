"""Reconciliation and offers with a relay on a Redis store, over real HTTPS (issue 26).

Each relay is ``akrelay serve`` in its own process on a free port; the Redis one keeps its log
in the test's own flushed database of the session's ``redis-server`` (tests/conftest.py), under a
key namespace of its own. The other side is an ordinary SQLite data directory running the real
``akrelay sync --reconcile``:

* the Redis relay *receives* offers: we (SQLite) hold events it lacks, and one forged record
  (a genuine event whose stored signature was replaced in our file), and offer them; the Redis
  relay verifies each submission, stores the genuine ones and refuses the forged one with
  ``invalid_signature``; a second pass offers nothing;
* the Redis relay *initiates*: ``akrelay sync --reconcile --store redis://...`` pulls its need
  from a served SQLite relay and offers that relay what it lacks.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from akrelay.cli import main
from akrelay.protocol.envelope import verify_envelope

from .conftest import Author
from .test_reconcile_cli import seed as seed_sqlite

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from relay_harness import Served, start_relay  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.redis]

NAMESPACE = "recon-e2e"


def served_on_redis(data: Path, redis_url: str) -> Served:
    return start_relay(data, extra=["--store", redis_url, "--store-namespace", NAMESPACE,
                                    "--write-rate", "0", "--read-rate", "0"])


def served_on_sqlite(data: Path) -> Served:
    return start_relay(data, extra=["--write-rate", "0", "--read-rate", "0"])


def client(served: Served) -> httpx.Client:
    return httpx.Client(base_url=served.origin, verify=served.ssl_context(), trust_env=False, timeout=30)


def post_all(served: Served, envelopes: list[dict]) -> None:
    with client(served) as c:
        for env in envelopes:
            r = c.post("/v1/knowledge/events", content=json.dumps(env), headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text


def held(served: Served) -> dict[str, dict[str, Any]]:
    """Every record the relay serves, by event hash, each envelope verified here."""
    out: dict[str, dict[str, Any]] = {}
    with client(served) as c:
        params = {"limit": "1000"}
        while True:
            page = c.get("/v1/knowledge/query", params=params).json()
            for record in page["result"]:
                verify_envelope(json.dumps(record["envelope"]).encode())
                out[record["envelope"]["hash"]] = record
            if "next_cursor" not in page:
                return out
            params = {"limit": "1000", "cursor": page["next_cursor"]}




def forge_signature(data: Path, victim: dict, donor: dict) -> bytes:
    """Replace ``victim``'s stored signature with ``donor``'s (well-formed, but not over this event); the bytes now stored."""
    conn = sqlite3.connect(data / "relay.sqlite3")
    try:
        (body,) = conn.execute("SELECT body FROM records WHERE id = ?", (victim["hash"],)).fetchone()
        forged = bytes(body).replace(victim["signature"].encode(), donor["signature"].encode())
        assert forged != bytes(body)
        conn.execute("UPDATE records SET body = ? WHERE id = ?", (forged, victim["hash"]))
        conn.commit()
    finally:
        conn.close()
    return forged


def add_peer(peers_file: Path, served: Served) -> None:
    assert main(["peers", "--file", str(peers_file), "add", served.origin, "--ca-file", str(served.cacert),
                 "--allow-private"]) == 0


def status_of(capsys, *where: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["peers", "--json", "status", *where]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1, rows
    return dict(rows[0])


def test_a_redis_relay_receives_offers_verifies_each_and_refuses_a_forgery(tmp_path, redis_url, capsys) -> None:
    author = Author("offers-to-redis")
    evs = [author.publish(f"Event {i}") for i in range(20)]
    redis_relay = served_on_redis(tmp_path / "redis-node", redis_url)
    try:
        post_all(redis_relay, evs[:14])
        ours, our_origin = tmp_path / "ours", "https://127.0.0.1:1"
        forged_event = author.publish("Forged on the way")
        seed_sqlite(ours, our_origin, [*evs, forged_event])
        forged_body = forge_signature(ours, forged_event, evs[0])
        peers_file = tmp_path / "peers.toml"
        add_peer(peers_file, redis_relay)
        command = ["sync", "--data", str(ours), "--origin", our_origin, "--peers", str(peers_file), "--reconcile"]
        capsys.readouterr()
        assert main(command) == 0
        out1 = capsys.readouterr().out
        after_first = held(redis_relay)
        status1 = status_of(capsys, "--data", str(ours))
        assert main(command) == 0
        out2 = capsys.readouterr().out
        status2 = status_of(capsys, "--data", str(ours))
        with client(redis_relay) as c:
            lookups = {e["hash"]: c.get(f"/v1/knowledge/events/{e['hash']}").status_code for e in [*evs, forged_event]}
            direct = c.post("/v1/knowledge/events", content=forged_body, headers={"content-type": "application/json"})
    finally:
        redis_relay.stop()
    # seven we hold and it lacks: six stored, the forgery refused by the Redis relay's own verification
    assert "have 7, need 0" in out1 and "offered 7: 6 stored, 1 refused" in out1, out1
    assert set(after_first) == {e["hash"] for e in evs}
    assert lookups == {**{e["hash"]: 200 for e in evs}, forged_event["hash"]: 404}
    assert direct.status_code == 400 and direct.json()["error"]["code"] == "invalid_signature", direct.text
    counts = status1["counts"]
    assert (counts["offered"], counts["offers_accepted"], counts["offers_refused"]) == (7, 6, 1), counts
    assert status1["offer_refused"] == [forged_event["hash"]]
    assert "offered 7: 6 stored, 1 refused" in status1["reconcile_note"]
    # the second pass: only the refused forgery is still missing there, and it is never offered again
    assert "have 1, need 0" in out2 and "offered" not in out2, out2
    assert (status2["counts"]["offered"], status2["counts"]["offers_accepted"]) == (7, 6)
    # nothing of the forgery reached the Redis keys either
    import redis

    from akrelay.store.redis.store import RedisStore

    store = RedisStore(redis_url, namespace=NAMESPACE)
    try:
        assert store.get(forged_event["hash"]) is None
        assert {r.id for r in store.iter_records(0, 1000)} == {e["hash"] for e in evs}
    finally:
        store.close()
    keys = redis.Redis.from_url(redis_url)
    try:
        assert all(k.startswith(NAMESPACE.encode() + b":") for k in keys.scan_iter(count=1000))
    finally:
        keys.close()


def test_a_redis_relay_initiates_pulls_its_need_and_offers_its_have(tmp_path, redis_url, capsys) -> None:
    author = Author("redis-initiator")
    evs = [author.publish(f"Event {i}") for i in range(24)]
    sqlite_relay = served_on_sqlite(tmp_path / "sqlite-node")
    try:
        post_all(sqlite_relay, evs[:20])  # it lacks the last four
        from akrelay.node import open_relay_for
        from akrelay.settings import defaults

        ours = tmp_path / "redis-data"
        settings = defaults(data=str(ours), store=redis_url, store_namespace=NAMESPACE, origin="https://127.0.0.1:1")
        relay = open_relay_for(settings)
        try:
            for env in evs[6:]:  # we lack the first six
                relay.submit(json.dumps(env).encode())
        finally:
            relay.close()
        peers_file = tmp_path / "peers.toml"
        add_peer(peers_file, sqlite_relay)
        command = ["sync", "--data", str(ours), "--store", redis_url, "--store-namespace", NAMESPACE,
                   "--origin", "https://127.0.0.1:1", "--peers", str(peers_file), "--reconcile"]
        capsys.readouterr()
        assert main(command) == 0
        out1 = capsys.readouterr().out
        status = status_of(capsys, "--data", str(ours), "--store", redis_url, "--store-namespace", NAMESPACE)
        assert main(command) == 0
        out2 = capsys.readouterr().out
        peer_holds = held(sqlite_relay)
    finally:
        sqlite_relay.stop()
    assert "have 4, need 6" in out1 and "accepted 6" in out1 and "offered 4: 4 stored, 0 refused" in out1, out1
    assert "have 0, need 0" in out2 and "offered" not in out2, out2
    assert set(peer_holds) == {e["hash"] for e in evs}
    assert (status["counts"]["offered"], status["counts"]["offers_accepted"]) == (4, 4), status["counts"]
    from akrelay.store.redis.store import RedisStore

    store = RedisStore(redis_url, namespace=NAMESPACE)
    try:
        records = store.iter_records(0, 1000)
        assert {r.id for r in records} == {e["hash"] for e in evs}
        assert len(records) == len(evs)
        for r in records:  # what was pulled is stored as verified envelopes
            verify_envelope(r.canonical_bytes())
    finally:
        store.close()
