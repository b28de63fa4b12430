"""Redis mode served for real (issue 23): two ``akrelay serve`` nodes on one redis-server, one --log-key
file, ingest through both, kill -9 one node mid-ingest and restart it: every checkpoint either node
signed, before and after, is consistent with every other (checked with the RFC-only verifier), and the
root recomputed from /v1/knowledge/log is the latest checkpoint's."""

from __future__ import annotations

import base64
import itertools
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import rfc9162_naive as naive
from relay_harness import Served, start_relay
from test_audit_cli import envelope

from akrelay.protocol.note import open_checkpoint, parse_vkey, raw_public_key, vkey
from akrelay.relay.transparency import load_or_create_key

pytestmark = [pytest.mark.slow, pytest.mark.redis]
ORIGIN = "https://relay.test"  # the deployment's one origin: both nodes sign as relay.test


def node(data: Path, redis_url: str, key: Path) -> Served:
    return start_relay(data, pass_origin=False,
                       extra=["--store", redis_url, "--log-key", str(key), "--origin", ORIGIN])


def post(served: Served, env: dict[str, Any]) -> dict[str, Any] | None:
    try:
        response = httpx.post(served.origin + "/v1/knowledge/events", json=env, verify=served.ssl_context(), timeout=30)
    except httpx.HTTPError:
        return None  # the node was killed under this request: not acknowledged
    assert response.status_code == 200, response.text
    return dict(response.json())


def checkpoint(served: Served, at_least: int, verifier: Any) -> Any:
    """A verified checkpoint of at least ``at_least`` entries (the node signs about once a second)."""
    deadline = time.monotonic() + 45
    while True:
        text = httpx.get(served.origin + "/v1/knowledge/checkpoint", verify=served.ssl_context(), timeout=30).text
        cp, _ = open_checkpoint(text, verifier, origin="relay.test")
        if cp.size >= at_least:
            return cp
        assert time.monotonic() < deadline, f"no checkpoint of {at_least} entries from {served.origin}"
        time.sleep(0.2)


def consistent(served: Served, older: Any, newer: Any) -> bool:
    if older.size == newer.size:
        return older.root == newer.root
    body = httpx.get(f"{served.origin}/v1/knowledge/proof/consistency?from={older.size}&to={newer.size}",
                     verify=served.ssl_context(), timeout=30).json()
    proof = [base64.b64decode(h) for h in body["hashes"]]
    return naive.verify_consistency(older.size, newer.size, older.root, newer.root, proof)


def test_two_served_nodes_on_one_redis_sign_one_history_across_a_kill_9(tmp_path: Path, redis_url: str) -> None:
    key_file = tmp_path / "log-key.pem"
    key = load_or_create_key(key_file, create=True)
    verifier = parse_vkey(vkey("relay.test", raw_public_key(key.public_key())))
    numbers = itertools.count()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:  # the two first starts overlap: most of this test is process start-up
        started = [pool.submit(node, tmp_path / name, redis_url, key_file) for name in ("a", "b")]
    nodes = [f.result() for f in started if f.exception() is None]
    for f in started:
        if f.exception() is not None:
            for n in nodes:
                n.stop()
            raise f.exception()  # type: ignore[misc]
    a, b = nodes
    acked: list[dict[str, Any]] = []
    try:
        for i in range(10):
            record = post(nodes[i % 2], envelope(next(numbers)))
            assert record is not None
            acked.append(record)
        before = [checkpoint(n, 10, verifier) for n in nodes]

        # a stream of submissions to A, and A killed -9 while it runs
        stop = threading.Event()

        def stream() -> None:
            while not stop.is_set():
                record = post(a, envelope(next(numbers)))
                if record is None:
                    return
                acked.append(record)

        writer = threading.Thread(target=stream)
        writer.start()
        deadline = time.monotonic() + 30
        while len(acked) < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        a.stop(signal.SIGKILL)
        stop.set()
        writer.join(60)
        a = node(tmp_path / "a", redis_url, key_file)
        nodes = [a, b]
        for i in range(10):
            record = post(nodes[i % 2], envelope(next(numbers)))
            assert record is not None
            acked.append(record)
        after = [checkpoint(n, len(acked), verifier) for n in nodes]

        signed = sorted(before + after, key=lambda c: c.size)
        for older, newer in itertools.combinations(signed, 2):
            assert consistent(b, older, newer), (older.size, newer.size)
            assert consistent(a, older, newer), (older.size, newer.size)
        latest = signed[-1]
        entries: list[dict[str, Any]] = []
        while len(entries) < latest.size:
            page = httpx.get(f"{b.origin}/v1/knowledge/log?start={len(entries)}&limit=1000",
                             verify=b.ssl_context(), timeout=30).json()
            entries += page["entries"]
        entries = entries[: latest.size]
        data = [e["seq"].to_bytes(8, "big") + base64.urlsafe_b64decode(e["hash"] + "=") for e in entries]
        assert naive.MTH(data) == latest.root
        logged = {e["seq"]: e["hash"] for e in entries}
        for record in acked:  # every acknowledged acceptance is its entry in the one tree
            assert logged.get(record["seq"]) == record["envelope"]["hash"], record["seq"]
    finally:
        for n in nodes:
            n.stop()
