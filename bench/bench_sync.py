"""Federation throughput: catch-up from a peer, and steady-state propagation delay.

Builds a peer relay holding N really signed events (default 50,000) in a
temporary data directory, serves it with ``akrelay serve`` over TLS on
127.0.0.1 (both relays on this machine), then:

* **catch-up**: a fresh relay runs one sync pass against it (the code path of
  ``akrelay sync --once``: discovery, query pages with cursors, envelope
  verification and the full acceptance pipeline into SQLite). Goal: >= 1,500
  events/s.
* **propagation**: with the sync loop running (poll interval ``--interval``),
  events are published to the peer one at a time over HTTPS; the delay is from
  the peer's acceptance (the POST returning) to acceptance in the local store.
  Goal: <= 2 x the poll interval.

Usage: python bench/bench_sync.py [--events 50000] [--interval 1.0] [--samples 20]
Last line: ``sync_catchup_<N>: <rate> events/s``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from akrelay.federation.peers import Peer
from akrelay.federation.scheduler import SyncScheduler
from akrelay.federation.state import FederationState
from akrelay.federation.sync import SyncEngine, SyncOptions
from akrelay.protocol.signer import Signer, publish_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import open_relay
from akrelay.tls import ensure_self_signed

LICENSE = "https://creativecommons.org/licenses/by/4.0/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_event(signer: Signer, nonce: int, created_at: int, rng: random.Random) -> bytes:
    words = " ".join(rng.choice(("cache", "latency", "graph", "proof", "sample", "model", "trial")) for _ in range(12))
    payload = {
        "license": LICENSE, "kind": "observation", "title": f"Observation {nonce}",
        "statement": f"Under the stated conditions we observed {words}.", "language": "en",
        "context": {"scope": "A synthetic benchmark corpus.", "conditions": ["Two cores."], "limitations": []},
        "basis": "Generated for bench_sync.", "tags": ["bench", f"t{nonce % 50}"],
    }
    return json.dumps(signer.sign(publish_event(signer.agent_id, created_at, nonce, payload))).encode()


def build_peer(data: Path, origin: str, n: int) -> float:
    rng = random.Random(7)
    signers = [Signer.from_seed(bytes([i + 1]) * 32) for i in range(20)]
    relay = open_relay(data, RelayConfig(origin=origin))
    start = time.perf_counter()
    base = int(time.time() * 1000) - 86_400_000
    for i in range(n):
        relay.submit(make_event(signers[i % len(signers)], i // len(signers) + 1, base + i, rng))
    elapsed = time.perf_counter() - start
    assert relay.checkpoint() == n
    relay.close()
    return elapsed


def start_serve(data: Path, port: int, origin: str, extra: list[str] | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    log = open(data.parent / "peer.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "akrelay", "serve", "--data", str(data), "--host", "127.0.0.1", "--port", str(port),
         "--origin", origin, "--read-rate", "0", "--write-rate", "0", *(extra or [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ctx = ssl.create_default_context(cafile=str(data / "tls-cert.pem"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(origin + "/.well-known/agent-knowledge", verify=ctx, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("peer relay did not start")


def stop_serve(proc: subprocess.Popen) -> None:
    """SIGTERM the served relay's process group; SIGKILL it if it has not exited within 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--page-limit", type=int, default=1000)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        tmp_path = Path(tmp)
        peer_dir, local_dir = tmp_path / "peer", tmp_path / "local"
        port = free_port()
        origin = f"https://127.0.0.1:{port}"
        build_s = build_peer(peer_dir, origin, args.events)
        print(f"built peer with {args.events} signed events in {build_s:.1f} s "
              f"({args.events / build_s:.0f} events/s through Relay.submit)", flush=True)
        cert = ensure_self_signed(peer_dir, origin).cert
        proc = start_serve(peer_dir, port, origin)
        try:
            relay = open_relay(local_dir, RelayConfig(origin="https://127.0.0.1:1"))
            state = FederationState.open_in(local_dir)
            peer = Peer(origin=origin, ca_file=str(cert), allow_private=True, page_limit=args.page_limit,
                        interval=args.interval)
            engine = SyncEngine(relay, state, [peer], SyncOptions(own_origin="https://127.0.0.1:1"))

            start = time.perf_counter()
            [result] = engine.run_once(force=True)
            catchup_s = time.perf_counter() - start
            assert result.ok, result.error
            assert relay.checkpoint() == args.events and result.accepted == args.events, result
            rate = args.events / catchup_s
            print(f"catch-up: {args.events} events in {catchup_s:.1f} s over {result.pages} pages", flush=True)

            stop = threading.Event()
            loop = threading.Thread(target=SyncScheduler(engine).run, args=(stop,), daemon=True)
            loop.start()
            signer = Signer.from_seed(b"\x99" * 32)
            rng = random.Random(11)
            delays = []
            ctx = ssl.create_default_context(cafile=str(cert))
            with httpx.Client(verify=ctx, trust_env=False, timeout=30) as client:
                for i in range(args.samples):
                    time.sleep(rng.uniform(0, args.interval))
                    raw = make_event(signer, i + 1, int(time.time() * 1000), rng)
                    event_id = json.loads(raw)["hash"]
                    r = client.post(origin + "/v1/knowledge/events", content=raw,
                                    headers={"content-type": "application/json"})
                    assert r.status_code == 200, r.text
                    accepted_there = time.perf_counter()
                    while relay.store.get(event_id) is None:
                        if time.perf_counter() - accepted_there > 60:
                            raise RuntimeError("event did not propagate within 60 s")
                        time.sleep(0.002)
                    delays.append(time.perf_counter() - accepted_there)
            stop.set()
            loop.join(10)
            engine.close()
            state.close()
            relay.close()
        finally:
            stop_serve(proc)

    delays.sort()
    p50 = statistics.median(delays)
    worst = delays[-1]
    print(f"sync_propagation_p50: {p50:.3f} s (poll interval {args.interval:g} s, {args.samples} samples)")
    print(f"sync_propagation_max: {worst:.3f} s (goal <= {2 * args.interval:g} s)")
    print(f"sync_catchup_{args.events // 1000}k: {rate:.0f} events/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
