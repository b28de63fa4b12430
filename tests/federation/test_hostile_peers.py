"""Hostile peers on real TLS sockets, against ``akrelay sync --once`` and ``akrelay serve --peers``.

Every scenario is a :class:`~tests.federation.hostile.HostilePeer` on 127.0.0.1
listed before an honest peer. For each, the syncing process must end the
hostile pass in bounded time with the expected diagnosis, stay within
``MEMORY_BOUND`` of its baseline (RSS high-water mark, reset before each
measurement), still take everything from the honest peer, and never connect
anywhere but loopback (an audit hook in the child records every
``socket.connect``; the ``Sentinel`` stands for "somewhere else").
"""

from __future__ import annotations

import functools
import json
import os
import random
import string
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from akrelay.federation.peers import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_PAGE_BYTES
from akrelay.federation.state import FederationState, PeerState
from akrelay.federation.transport import BYTES_PER_VALUE
from akrelay.tls import ensure_self_signed

from .conftest import Author
from .hostile import CONNECT_LOGGER, Conn, HostilePeer, Request, Sentinel, connected_hosts

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
#: Most a sync pass may add to the syncing process's peak RSS, whatever a peer sends.
MEMORY_BOUND = 64 * MiB
#: Deadline of one request for the timing scenarios (drip, slow body).
SHORT_DEADLINE = 1.0
#: Decompressed size of the compression bombs (their wire size is a few hundred bytes to 260 KB).
BOMB_BYTES = 256 * MiB
AS_OF = 1_800_000_000_000
#: Longest a ``sync --once`` run over one hostile and one honest peer may take (room for a loaded
#: machine, below the 60 s the header drip held a pass before the fixes).
RUN_SECONDS = 45.0


# -- scripted answers ----------------------------------------------------------


def record(envelope: dict, seq: int) -> dict:
    return {"envelope": envelope, "accepted_at": 1_700_000_000_000 + seq, "seq": seq}


def page_of(peer: HostilePeer, envelopes: list[dict], request: Request) -> dict:
    """One complete page holding ``envelopes`` as seq 1..n (after ``after_seq``), whatever they are."""
    after = int(request.params.get("after_seq", "0"))
    records = [record(env, i) for i, env in enumerate(envelopes, 1) if i > after]
    return {"result": records, "service": peer.origin, "checkpoint": len(envelopes), "as_of": AS_OF}


def static_page(envelopes: list[dict], *, batch: Callable[[HostilePeer, list[str]], dict] | None = None):
    """Serve exactly ``envelopes`` (valid or not) in one page; ``batch`` scripts the batch answer."""

    def scenario(peer: HostilePeer, conn: Conn, request: Request) -> bool:
        if request.path == peer.data.query_path:
            conn.json(200, page_of(peer, envelopes, request))
            peer.note("done")
            return True
        if request.path == peer.data.batch_path and batch is not None:
            conn.json(200, batch(peer, json.loads(request.body)["hashes"]))
            peer.note("done")
            return True
        return False

    return scenario


def on_query(answer: Callable[[HostilePeer, Conn, Request], None]):
    """Script the query answer only; discovery and batch stay honest. Waits for the peer's gate."""

    def scenario(peer: HostilePeer, conn: Conn, request: Request) -> bool:
        if request.path != peer.data.query_path:
            return False
        if peer.wait_gate():
            answer(peer, conn, request)
        peer.note("done")
        return True

    return scenario


def _gzip(chunks) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join([c.compress(ch) for ch in chunks] + [c.flush()])


@functools.lru_cache(maxsize=1)
def bombs() -> tuple[bytes, bytes]:
    """``BOMB_BYTES`` of zeros gzipped once (about 260 KB) and twice (about 600 bytes)."""
    once = _gzip(b"\0" * MiB for _ in range(BOMB_BYTES // MiB))
    return once, _gzip([once])


def bomb(layers: int):
    def answer(peer: HostilePeer, conn: Conn, request: Request) -> None:
        body = bombs()[layers - 1]
        conn.respond(200, body, [("content-type", "application/json"),
                                 ("content-encoding", ", ".join(["gzip"] * layers))])
    return answer


def header_drip(peer: HostilePeer, conn: Conn, request: Request) -> None:
    """A status line, then one header byte every 50 ms, for as long as anyone listens."""
    if conn.write(b"HTTP/1.1 200 OK\r\nx-drip: "):
        conn.drip((b"a" for _ in range(10**6)), 0.05, limit=60)


def slow_body(peer: HostilePeer, conn: Conn, request: Request) -> None:
    _, body = peer.data.query(request.params)
    data = json.dumps(body).encode()
    if conn.write(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
                  .encode()):
        conn.drip((data[i:i + 1] for i in range(len(data))), 0.05, limit=60)


def huge_body(peer: HostilePeer, conn: Conn, request: Request) -> None:
    """50 MB without a Content-Length (the body ends when the connection closes)."""
    if conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n["):
        piece = b'"' + b"x" * (MiB - 3) + b'",'
        for _ in range(50):
            if not conn.write(piece):
                return
    conn.keep_alive = False


def dense_body(cap: int) -> bytes:
    """The costliest body within ``cap`` bytes and its JSON value cap: as many empty objects as
    the value cap nearly allows (60,000 at 8 MiB) and one string filling the rest."""
    objects = b"{}," * ((cap // BYTES_PER_VALUE - 5_000) // 2)
    return b"[" + objects + b'"' + b"y" * (cap - len(objects) - 8) + b'"]'


def dense_json(peer: HostilePeer, conn: Conn, request: Request) -> None:
    conn.respond(200, dense_body(DEFAULT_MAX_PAGE_BYTES), [("content-type", "application/json")])


def build_dense_at_once(world: "World", peer: HostilePeer) -> dict:
    """Page 1 is small and needs a batch: so page 2 is prefetched while the batch is asked for,
    and both answers are the costliest bodies their caps allow, in flight at the same time."""
    base = Author("dense-base").publish("Only batch has it")
    review = Author("dense-review").assess(base)

    def scenario(peer: HostilePeer, conn: Conn, request: Request) -> bool:
        if request.path == peer.data.query_path and "cursor" not in request.params:
            conn.json(200, {"result": [record(review, 1)], "service": peer.origin, "checkpoint": 2,
                            "as_of": AS_OF, "next_cursor": "page-2"})
            return True
        if request.path in (peer.data.query_path, peer.data.batch_path):
            if peer.wait_gate():
                cap = DEFAULT_MAX_PAGE_BYTES if request.path == peer.data.query_path else DEFAULT_MAX_BATCH_BYTES
                conn.respond(200, dense_body(cap), [("content-type", "application/json")])
            peer.note("done")
            return True
        return False

    peer.scenario = scenario
    return {"review": review["hash"]}


def check_dense_at_once(st: PeerState, pending: int, ids: set[str], info: Any) -> bool:
    return ("invalid query page" in (st.last_error or "") and st.counts["batch_errors"] >= 1
            and pending == 1 and st.resume_seq == 1 and info["review"] not in ids)


def redirect_to(sentinel: Sentinel):
    def answer(peer: HostilePeer, conn: Conn, request: Request) -> None:
        conn.respond(302, b"", [("location", sentinel.origin + "/v1/knowledge/query")])
    return answer


def error_500_retry_after(peer: HostilePeer, conn: Conn, request: Request) -> None:
    conn.json(500, {"error": {"code": "internal", "message": "come back tomorrow"}}, [("retry-after", "86400")])


def endless_pages(envelope: dict):
    """One duplicate event per page, a fresh 4 KiB cursor each time, never a last page."""

    def answer(peer: HostilePeer, conn: Conn, request: Request) -> None:
        cursor = request.params.get("cursor")
        seq = int(cursor.split(".")[0]) + 1 if cursor else int(request.params.get("after_seq", "0")) + 1
        fresh = "".join(random.choices(string.ascii_letters, k=4000))
        conn.json(200, {"result": [record(envelope, seq)], "service": peer.origin, "checkpoint": 2**50,
                        "as_of": AS_OF, "next_cursor": f"{seq}.{fresh}"})

    return answer


def out_of_order(peer: HostilePeer, conn: Conn, request: Request) -> None:
    status, body = peer.data.query(request.params)
    seqs = [r["seq"] for r in body["result"]]
    for r, seq in zip(body["result"], [seqs[1], seqs[0], *seqs[2:]]):
        r["seq"] = seq
    conn.json(status, body)


def tampered(envelope: dict, **changes: Any) -> dict:
    return {**envelope, **changes}


# -- the cases -----------------------------------------------------------------


@dataclass
class Case:
    """A hostile peer's behaviour, its settings in the peer file, and what the relay must end up with."""

    name: str
    build: Callable[["World", HostilePeer], Any]
    check: Callable[[PeerState, int, set[str], Any], bool]
    settings: dict[str, Any] = field(default_factory=dict)
    #: Memory-heavy scenarios run one at a time under ``serve`` (their gate opens in turn).
    heavy: bool = False


def failed(fragment: str, *, starts: bool = False):
    def check(st: PeerState, pending: int, ids: set[str], info: Any) -> bool:
        error = st.last_error or ""
        return st.counts["failed_passes"] >= 1 and (error.startswith(fragment) if starts else fragment in error)
    return check


def seed(peer: HostilePeer, n: int = 3, name: str = "seeded") -> list[dict]:
    author = Author(f"{name}-{peer.port}")
    events = [author.publish(f"{name} {i}") for i in range(n)]
    peer.data.add(*events)
    return events


def build_forged(kind: str):
    def build(world: "World", peer: HostilePeer) -> list[dict]:
        author = Author(f"forger-{kind}")
        events = [author.publish(f"{kind} {i}") for i in range(3)]
        if kind == "hash":
            bad = tampered(events[1], hash=events[0]["hash"][:-2] + "AA")
        elif kind == "signature":
            bad = tampered(events[1], signature=events[0]["signature"])
        else:  # a retraction of the forger's event, signed by someone else
            bad = Author("mallory").retract(events[0])
        peer.scenario = static_page([events[0], bad, events[2]])
        return {"good": [events[0]["hash"], events[2]["hash"]], "bad": bad["hash"]}
    return build


def check_forged(st: PeerState, pending: int, ids: set[str], info: Any) -> bool:
    return (st.last_success is not None and st.last_error is None and st.counts["rejected"] >= 1
            and set(info["good"]) <= ids and info["bad"] not in ids)


def build_batch(kind: str):
    """A page with an assessment whose target only ``batch`` can supply, and a broken batch answer."""

    def build(world: "World", peer: HostilePeer) -> dict:
        alice, bob = Author(f"alice-{kind}"), Author(f"bob-{kind}")
        base, other = alice.publish("Batch base"), alice.publish("Not asked for")
        review = bob.assess(base)

        def answer(peer: HostilePeer, hashes: list[str]) -> dict:
            body = {"result": [], "missing": [[h] for h in hashes], "service": peer.origin,
                    "checkpoint": 1, "as_of": AS_OF}
            if kind == "swapped":
                body.update(result=[record(other, 1)], missing=[])
            return body

        peer.scenario = static_page([review], batch=answer)
        return {"review": review["hash"], "base": base["hash"], "other": other["hash"]}

    return build


def check_batch(st: PeerState, pending: int, ids: set[str], info: Any) -> bool:
    # The pass succeeds and moves on; only the event that needed the batch waits.
    return (st.last_success is not None and st.last_error is None and st.checkpoint == 1
            and st.counts["batch_errors"] >= 1 and pending == 1 and not ids & set(info.values()))


def build_endless(world: "World", peer: HostilePeer) -> dict:
    envelope = Author("looper").publish("The same event on every page")
    peer.scenario = on_query(endless_pages(envelope))
    return {"event": envelope["hash"]}


def check_endless(st: PeerState, pending: int, ids: set[str], info: Any) -> bool:
    # Failed at the page limit, but what it verified is kept: the next pass resumes after it.
    return ("exceeded 200 pages" in (st.last_error or "") and st.resume_seq >= 200 and st.checkpoint == 0
            and info["event"] in ids)


def build_query(answer: Callable[[HostilePeer, Conn, Request], None]):
    def build(world: "World", peer: HostilePeer) -> None:
        seed(peer)
        peer.scenario = on_query(answer)
    return build


def build_redirect(world: "World", peer: HostilePeer) -> None:
    seed(peer)
    peer.scenario = on_query(redirect_to(world.sentinel))


def build_off_origin(world: "World", peer: HostilePeer) -> None:
    seed(peer)
    peer.data.discovery_doc["endpoints"]["query"] = world.sentinel.origin + "/v1/knowledge/query"


def check_retry_after_ignored(st: PeerState, pending: int, ids: set[str], info: Any) -> bool:
    # Retry-After is honoured on 429 and 503 only: a 500 gets the ordinary back-off, not a day.
    return ("500" in (st.last_error or "") and st.last_attempt is not None
            and st.retry_at - st.last_attempt < 300_000)


CASES = [
    Case("bomb-gzip", build_query(bomb(1)), failed("encoding", starts=True), heavy=True),
    Case("bomb-gzip-gzip", build_query(bomb(2)), failed("encoding", starts=True), heavy=True),
    Case("huge-body", build_query(huge_body), failed("too_large", starts=True), heavy=True,
         settings={"max_page_bytes": 16 * MiB}),
    Case("dense-json", build_query(dense_json), failed("invalid query page"), heavy=True),
    Case("dense-page-and-batch-at-once", build_dense_at_once, check_dense_at_once, heavy=True),
    Case("header-drip", build_query(header_drip), failed("timeout", starts=True),
         settings={"read_timeout": SHORT_DEADLINE}),
    Case("slow-body", build_query(slow_body), failed("timeout", starts=True),
         settings={"read_timeout": SHORT_DEADLINE}),
    Case("malformed-batch", build_batch("malformed"), check_batch),
    Case("swapped-batch", build_batch("swapped"), check_batch),
    Case("endless-pages", build_endless, check_endless, settings={"max_pages": 200}),
    Case("bad-hash", build_forged("hash"), check_forged),
    Case("bad-signature", build_forged("signature"), check_forged),
    Case("foreign-retraction", build_forged("retraction"), check_forged),
    Case("out-of-order", build_query(out_of_order), failed("out of order")),
    Case("redirect", build_redirect, failed("redirect", starts=True)),
    Case("off-origin-discovery", build_off_origin, failed("not on")),
    Case("retry-after-on-500", build_query(error_500_retry_after), check_retry_after_ignored),
]


# -- the world -----------------------------------------------------------------


@dataclass
class World:
    tmp: Path
    cert: str
    key: str
    sentinel: Sentinel
    honest: HostilePeer
    honest_events: list[dict]
    peers: dict[str, HostilePeer]
    infos: dict[str, Any]
    site: Path

    def peer_table(self, peer: HostilePeer, **settings: Any) -> str:
        values = {"origin": peer.origin, "ca_file": self.cert, "allow_private": True, "interval": 1.0,
                  "connect_timeout": 5.0, "read_timeout": 20.0, **settings}
        lines = ["[[peer]]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        return "\n".join(lines) + "\n"

    def env(self, connect_log: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
        env["PYTHONPATH"] = os.pathsep.join([str(self.site), env.get("PYTHONPATH", "")])
        env["HOSTILE_CONNECT_LOG"] = str(connect_log)
        return env


@pytest.fixture
def world(tmp_path):
    bombs()  # built before any pass is timed
    files = ensure_self_signed(tmp_path / "tls", "https://127.0.0.1:1")
    cert, key = str(files.cert), str(files.key)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CONNECT_LOGGER)
    sentinel = Sentinel()
    honest = HostilePeer(cert, key, name="honest")
    honest_events = seed(honest, 4, "honest")
    peers: dict[str, HostilePeer] = {}
    infos: dict[str, Any] = {}
    w = World(tmp_path, cert, key, sentinel, honest, honest_events, peers, infos, site)
    try:
        for case in CASES:
            peer = HostilePeer(cert, key, name=case.name)
            peers[case.name] = peer
            infos[case.name] = case.build(w, peer)
        yield w
    finally:
        for peer in [honest, *peers.values()]:
            peer.stop()
        sentinel.stop()


def assert_loopback_only(connect_log: Path) -> None:
    hosts = connected_hosts(str(connect_log))
    assert hosts and hosts <= {"127.0.0.1"}, hosts


def status(data: Path, origin: str) -> tuple[PeerState, int]:
    state = FederationState.open_in(data)
    try:
        return state.get(origin), state.pending_count(origin)
    finally:
        state.close()


def stored_ids(data: Path) -> set[str]:
    from akrelay.store.sqlite import SqliteStore

    store = SqliteStore(data / "relay.sqlite3")
    try:
        return {r.id for r in store.iter_records(0, 1_000_000)}
    finally:
        store.close()


# -- sync --once ---------------------------------------------------------------


def test_sync_once_against_every_hostile_peer(world: World) -> None:
    runs = []
    honest_only = world.tmp / "peers-honest.toml"
    honest_only.write_text(world.peer_table(world.honest))
    runs.append({"name": "warm-up", "args": ["sync", "--once", "--peers", str(honest_only),
                                             "--data", str(world.tmp / "data-warm-up"),
                                             "--origin", "https://127.0.0.1:1"]})
    for case in CASES:
        peers_file = world.tmp / f"peers-{case.name}.toml"
        peers_file.write_text(world.peer_table(world.peers[case.name], **case.settings)
                              + world.peer_table(world.honest))
        runs.append({"name": case.name, "args": ["sync", "--once", "--peers", str(peers_file),
                                                 "--data", str(world.tmp / f"data-{case.name}"),
                                                 "--origin", "https://127.0.0.1:1"]})
    spec = world.tmp / "spec.json"
    spec.write_text(json.dumps({"runs": runs}))
    connect_log = world.tmp / "connects-once.log"
    probe = Path(__file__).with_name("sync_once_probe.py")
    done = subprocess.run([sys.executable, str(probe), str(spec)], capture_output=True, text=True,
                          env=world.env(connect_log), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    honest_ids = {e["hash"] for e in world.honest_events}
    for case in CASES:
        r = results[case.name]
        data = world.tmp / f"data-{case.name}"
        peer = world.peers[case.name]
        st, pending = status(data, peer.origin)
        ids = stored_ids(data)
        growth = (r["peak_kb"] - r["base_kb"]) * 1024
        print(f"{case.name}: {r['seconds']:.2f}s, +{growth / MiB:.1f} MiB peak RSS, {st.last_error}")
        assert case.check(st, pending, ids, world.infos[case.name]), (case.name, st, pending, r["stdout"])
        assert honest_ids <= ids, case.name  # the honest peer listed after it is unaffected
        assert f"{world.honest.origin}: ok" in r["stdout"], (case.name, r["stdout"])
        assert growth <= MEMORY_BOUND, (case.name, growth)
        # Generous for busy machines; before the fixes the header drip held a pass until the
        # dripping peer gave up (60 s here, hours in the wild) and endless pages took 134 s.
        assert r["seconds"] < RUN_SECONDS, (case.name, r["seconds"])
    assert world.sentinel.hits == 0
    assert_loopback_only(connect_log)


# -- serve --peers -------------------------------------------------------------


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak(pid: int) -> int:
    """Reset the process's RSS high-water mark; returns its current RSS in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")
    return _status_kb(pid, "VmRSS") * 1024


def lock_holder(lock: Path) -> int | None:
    """The pid holding the ``flock`` on ``lock`` (the process running the sync loop), if any."""
    try:
        inode = os.stat(lock).st_ino
    except FileNotFoundError:
        return None
    with open("/proc/locks") as fh:
        for line in fh:
            parts = line.split()
            if "FLOCK" in parts and "->" not in parts and parts[-3].endswith(f":{inode}"):
                return int(parts[-4])
    return None


def test_serve_with_hostile_peers_keeps_syncing_the_honest_one(world: World, monkeypatch) -> None:
    from .test_mesh_e2e import Node, free_port, wait_for

    for case in CASES:
        if case.heavy:
            world.peers[case.name].gate = threading.Event()
    data = world.tmp / "relay"
    peers_file = world.tmp / "peers-serve.toml"
    peers_file.write_text("".join(world.peer_table(world.peers[c.name], **c.settings,
                                                   **({"read_timeout": 60.0} if c.heavy else {}))
                                  for c in CASES) + world.peer_table(world.honest))
    connect_log = world.tmp / "connects-serve.log"
    env = world.env(connect_log)
    for name in [n for n in os.environ if n.startswith("AKRELAY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    monkeypatch.setenv("HOSTILE_CONNECT_LOG", env["HOSTILE_CONNECT_LOG"])
    node = Node("hostile-relay", data, free_port(), peers_file, world.tmp / "relay.log")
    ensure_self_signed(data, node.origin)
    node.start()
    try:
        wait_for(lambda: lock_holder(data / "federation.lock") is not None, timeout=120, what="the sync leader")
        pid = lock_holder(data / "federation.lock")
        base = _reset_peak(pid)  # from here on, every pass of every light scenario is measured
        started = time.monotonic()

        def settled(cases: list[Case]) -> bool:
            ids = set(node.ids())
            return all(c.check(*status(data, world.peers[c.name].origin), ids, world.infos[c.name]) for c in cases)

        honest_ids = {e["hash"] for e in world.honest_events}
        wait_for(lambda: honest_ids <= set(node.ids()), timeout=120, what="the honest peer's events")
        light = [c for c in CASES if not c.heavy]
        wait_for(lambda: settled(light), timeout=120, what="every light scenario's outcome")
        # The relay still answers its own clients promptly while the hostile passes go on.
        with node.client() as client:
            t0 = time.monotonic()
            assert client.get("/.well-known/agent-knowledge").status_code == 200
            assert time.monotonic() - t0 < 15.0  # not held by a pass (a drip lasts 60 s)
        growth = _status_kb(pid, "VmHWM") * 1024 - base
        print(f"light scenarios: {time.monotonic() - started:.1f}s, +{growth / MiB:.1f} MiB peak RSS")
        assert growth <= MEMORY_BOUND
        for case in [c for c in CASES if c.heavy]:
            peer = world.peers[case.name]
            assert not settled([case]) and peer.count("done") == 0, case.name  # held at its gate until now
            base = _reset_peak(pid)
            started = time.monotonic()
            peer.gate.set()
            wait_for(lambda: settled([case]), timeout=120, what=case.name)
            growth = _status_kb(pid, "VmHWM") * 1024 - base
            print(f"{case.name}: {time.monotonic() - started:.1f}s, +{growth / MiB:.1f} MiB peak RSS")
            assert growth <= MEMORY_BOUND, (case.name, growth)
        # A second round from the honest peer still arrives.
        later = seed(world.honest, 2, "honest-later")
        wait_for(lambda: {e["hash"] for e in later} <= set(node.ids()), timeout=120, what="later honest events")
        assert node.process.poll() is None
    finally:
        node.kill()
    assert world.sentinel.hits == 0
    assert_loopback_only(connect_log)
    assert "Traceback" not in node.log.read_text(errors="replace")
