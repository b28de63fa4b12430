"""Three real relays in a full mesh over TLS on loopback converge, and survive ``kill -9``.

Each relay is ``akrelay serve --peers FILE`` in its own process group with its
own data directory and self-signed certificate; each trusts the others only
through per-peer CA files (the environment's CA bundle would not verify them).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from akrelay.cli import main
from akrelay.protocol.envelope import verify_envelope
from akrelay.protocol.view import materialize
from akrelay.tls import ensure_self_signed

from .conftest import Author

pytestmark = pytest.mark.slow

INTERVAL = "0.3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    data: Path
    port: int
    peers: Path
    log: Path
    process: subprocess.Popen | None = None

    @property
    def origin(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def cert(self) -> Path:
        return self.data / "tls-cert.pem"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.origin, verify=ssl.create_default_context(cafile=str(self.cert)),
                            trust_env=False, timeout=30)

    workers: int = 1

    def start(self, timeout: float = 60.0) -> None:
        args = [sys.executable, "-m", "akrelay", "serve", "--data", str(self.data), "--host", "127.0.0.1",
                "--port", str(self.port), "--origin", self.origin, "--peers", str(self.peers),
                "--write-rate", "0", "--read-rate", "0", "--workers", str(self.workers)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited:\n{self.log.read_text(errors='replace')}")
                try:
                    if c.get("/.well-known/agent-knowledge", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start:\n{self.log.read_text(errors='replace')}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)
        self.process = None

    def submit(self, envelope: dict) -> dict:
        with self.client() as c:
            r = c.post("/v1/knowledge/events", content=json.dumps(envelope),
                       headers={"content-type": "application/json"})
        assert r.status_code == 200, (self.name, r.status_code, r.text)
        return r.json()

    def records(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        with self.client() as c:
            params: dict[str, str] = {"limit": "1000"}
            while True:
                page = c.get("/v1/knowledge/query", params=params).json()
                out.extend(page["result"])
                if "next_cursor" not in page:
                    return out
                params = {"limit": "1000", "cursor": page["next_cursor"]}

    def ids(self) -> list[str]:
        return [r["envelope"]["hash"] for r in self.records()]


def stored_ids(data: Path) -> list[str]:
    """IDs in a stopped relay's store, read directly from its data directory."""
    from akrelay.store.sqlite import SqliteStore

    store = SqliteStore(data / "relay.sqlite3")
    try:
        return [r.id for r in store.iter_records(0, 1_000_000)]
    finally:
        store.close()


def peer_status(node: Node) -> list[dict[str, Any]]:
    status = subprocess.run([sys.executable, "-m", "akrelay", "peers", "--json", "status", "--data", str(node.data)],
                            capture_output=True, text=True, check=True)
    return json.loads(status.stdout)


def wait_for(predicate, timeout: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


#: Seeded into r1 before it starts: ``hidden`` is withheld there, ``citing`` depends on it.
DAVE = Author("dave")
HIDDEN = DAVE.publish("Withheld at first")
CITING = Author("erin").assess(HIDDEN, "supports")


def seed_withheld_dependency(node: Node) -> None:
    from akrelay.relay.config import RelayConfig
    from akrelay.relay.core import open_relay

    relay = open_relay(node.data, RelayConfig(origin=node.origin))
    try:
        relay.submit(json.dumps(HIDDEN).encode())
        relay.submit(json.dumps(CITING).encode())
        relay.withhold(HIDDEN["hash"])
    finally:
        relay.close()


@pytest.fixture
def mesh(tmp_path):
    nodes = []
    for name in ("r1", "r2", "r3"):
        data = tmp_path / name
        node = Node(name, data, free_port(), tmp_path / f"{name}-peers.toml", tmp_path / f"{name}.log")
        node.workers = 2 if name == "r1" else 1  # two workers share r1's data dir: one sync leader
        ensure_self_signed(data, node.origin)
        nodes.append(node)
    seed_withheld_dependency(nodes[0])
    for node in nodes:  # full mesh, built with the CLI as a script would
        for other in nodes:
            if other is not node:
                assert main(["peers", "--file", str(node.peers), "add", other.origin, "--ca-file", str(other.cert),
                             "--allow-private", "--interval", INTERVAL]) == 0
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.kill(signal.SIGKILL)


def has(node: Node, *envelopes: dict) -> bool:
    ids = set(node.ids())
    return all(e["hash"] in ids for e in envelopes)


def test_three_relays_converge_and_a_killed_relay_resumes(mesh) -> None:
    r1, r2, r3 = mesh
    alice, bob, carol = Author("alice"), Author("bob"), Author("carol")
    # A dependency chain on r1.
    base = alice.publish("Chain base")
    v2 = alice.supersede(base, "Chain v2")
    v3 = alice.supersede(v2, "Chain v3")
    for env in (base, v2, v3):
        r1.submit(env)
    b1 = bob.publish("Bob's result")
    r2.submit(b1)
    c1 = carol.publish("Carol's question", kind="question")
    r3.submit(c1)
    # Assessments and retractions whose targets were published on another relay.
    wait_for(lambda: has(r2, base) and has(r3, b1) and has(r1, c1), what="first propagation")
    bob_on_base = bob.assess(base, "challenges")
    r2.submit(bob_on_base)
    carol_on_b1 = carol.assess(b1, "supports")
    r3.submit(carol_on_b1)
    answer = alice.publish("An answer", relations=[{"relation": "addresses", "target": c1["hash"]}])
    r1.submit(answer)
    wait_for(lambda: has(r3, base, v2, v3) and has(r1, bob_on_base), what="targets on other relays")
    alice_retracts_v2 = alice.retract(v2)
    r3.submit(alice_retracts_v2)
    bob_retracts = bob.retract(bob_on_base)
    r1.submit(bob_retracts)
    everything = {e["hash"] for e in (base, v2, v3, b1, c1, bob_on_base, carol_on_b1, answer,
                                       alice_retracts_v2, bob_retracts)}
    # r1 serves CITING but withholds its target: r2 and r3 keep CITING pending, never accepting it early.
    wait_for(lambda: set(r2.ids()) == everything and set(r3.ids()) == everything, what="convergence at r2, r3")
    for node in (r2, r3):
        rows = {row["origin"]: row for row in peer_status(node)}
        assert rows[r1.origin]["pending"] == 1 and rows[r1.origin]["counts"]["pending_added"] == 1
    # Made public again, HIDDEN keeps its old seq, below every checkpoint: only `batch` can fetch it.
    subprocess.run([sys.executable, "-m", "akrelay", "unwithhold", "--data", str(r1.data), "--", HIDDEN["hash"]],
                   check=True, capture_output=True)
    everything |= {HIDDEN["hash"], CITING["hash"]}
    wait_for(lambda: all(set(n.ids()) == everything for n in mesh), what="convergence")
    for node in (r2, r3):
        ids = node.ids()
        assert ids.index(HIDDEN["hash"]) < ids.index(CITING["hash"])  # dependency first
        # The pending set lives in the federation state, saved when the pass that accepted CITING
        # ends, a moment after the commit that made CITING visible: it must empty, not at once.
        wait_for(lambda: {row["origin"]: row for row in peer_status(node)}[r1.origin]["pending"] == 0,
                 timeout=30.0, what="the pending set to empty")
    views = []
    for node in mesh:
        ids = node.ids()
        assert len(ids) == len(set(ids)) == len(everything)
        envelopes = [verify_envelope(json.dumps(r["envelope"]).encode()) for r in node.records()]
        views.append(materialize(envelopes))
    assert views[0] == views[1] == views[2]
    assert views[0][v2["hash"]]["status"] == "retracted" and views[0][base["hash"]]["status"] == "active"
    assert views[0][bob_on_base["hash"]]["status"] == "retracted"

    # Kill r3 with SIGKILL while it is catching up on a burst published at r1, then restart it.
    burst = [carol.publish(f"Burst {i}") for i in range(300)]
    with r1.client() as c:
        for env in burst:
            assert c.post("/v1/knowledge/events", content=json.dumps(env),
                          headers={"content-type": "application/json"}).status_code == 200
    wait_for(lambda: len(r3.ids()) > len(everything), timeout=60, what="r3 to start catching up")
    r3.kill(signal.SIGKILL)
    held_at_kill = stored_ids(r3.data)
    print(f"r3 held {len(held_at_kill)} of {len(everything) + len(burst)} events when killed")
    assert len(held_at_kill) == len(set(held_at_kill)) > len(everything)
    partial = r3.data  # the store and the sync state survive in the data directory
    assert (partial / "federation.sqlite3").exists()
    r3.start()
    everything |= {e["hash"] for e in burst}
    wait_for(lambda: all(set(n.ids()) == everything for n in mesh), timeout=120, what="convergence after kill -9")
    for node in mesh:
        records = node.records()
        ids = [r["envelope"]["hash"] for r in records]
        seqs = [r["seq"] for r in records]
        assert len(ids) == len(set(ids)) == len(everything), node.name  # nothing lost, nothing duplicated
        assert seqs == sorted(set(seqs))
    rows = {row["origin"]: row for row in peer_status(r3)}
    assert set(rows) == {r1.origin, r2.origin}
    assert rows[r1.origin]["last_success"] and rows[r1.origin]["pending"] == 0
    with r1.client() as c:
        assert c.get("/.well-known/agent-knowledge").json()["peers"] == [r2.origin, r3.origin]

    # `akrelay sync --once` fills a fresh data directory from one relay of the mesh.
    fresh, fresh_peers = r1.data.parent / "fresh", r1.data.parent / "fresh-peers.toml"
    assert main(["peers", "--file", str(fresh_peers), "add", r1.origin, "--ca-file", str(r1.cert),
                 "--allow-private"]) == 0
    once = subprocess.run([sys.executable, "-m", "akrelay", "sync", "--once", "--data", str(fresh),
                           "--peers", str(fresh_peers), "--origin", "https://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=300)
    assert once.returncode == 0, once.stdout + once.stderr
    assert f"{r1.origin}: ok" in once.stdout
    assert sorted(stored_ids(fresh)) == sorted(everything)
