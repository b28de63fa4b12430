"""Push propagation: from acceptance on relay A to acceptance on relay B, which subscribes to A's stream.

Two relays run as ``akrelay serve`` over TLS on 127.0.0.1. B lists A as its peer
with a poll interval of ``--interval`` seconds (default 30: long enough that the
poll plays no part), so B learns of A's acceptances from A's push stream and
pulls them at once with the usual, verified ``after_seq`` pass. Events flow into
A at ``--rate`` per second (default 100) for ``--seconds`` (default 20), paced
by a clock, from a few client threads. The delay of each event is B's
``accepted_at`` minus A's (both relays on this machine's clock, in ms).

Goals (issue 26): p50 <= 100 ms and p99 <= 500 ms. The load average is printed
too: the machine is shared.

Usage: python bench/bench_push.py [--rate 100] [--seconds 20] [--interval 30]
Last line: ``push_propagation_p99: <ms> ms``.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import httpx

from akrelay.protocol.signer import Signer, publish_event
from akrelay.tls import ensure_self_signed

LICENSE = "https://creativecommons.org/licenses/by/4.0/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_event(signer: Signer, nonce: int, rng: random.Random) -> bytes:
    words = " ".join(rng.choice(("cache", "latency", "graph", "proof", "sample", "model", "trial")) for _ in range(12))
    payload = {
        "license": LICENSE, "kind": "observation", "title": f"Pushed observation {nonce}",
        "statement": f"Under the stated conditions we observed {words}.", "language": "en",
        "context": {"scope": "A synthetic benchmark corpus.", "conditions": ["Two cores."], "limitations": []},
        "basis": "Generated for bench_push.",
    }
    return json.dumps(signer.sign(publish_event(signer.agent_id, int(time.time() * 1000), nonce, payload))).encode()


class Relay:
    def __init__(self, root: Path, name: str) -> None:
        self.data = root / name
        self.port = free_port()
        self.origin = f"https://127.0.0.1:{self.port}"
        self.cert = ensure_self_signed(self.data, self.origin).cert
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "akrelay", "serve", "--data", str(self.data), "--host", "127.0.0.1",
                 "--port", str(self.port), "--origin", self.origin, "--read-rate", "0", "--write-rate", "0", *extra],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 120
        with self.client() as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.origin} exited:\n{self.log.read_text(errors='replace')}")
                try:
                    if client.get("/.well-known/agent-knowledge", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"{self.origin} did not start")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.origin, verify=ssl.create_default_context(cafile=str(self.cert)),
                            trust_env=False, timeout=30)

    def accepted(self) -> dict[str, int]:
        """event hash -> accepted_at of every record here."""
        out: dict[str, int] = {}
        with self.client() as client:
            params = {"limit": "1000"}
            while True:
                page = client.get("/v1/knowledge/query", params=params).json()
                out.update({r["envelope"]["hash"]: r["accepted_at"] for r in page["result"]})
                if "next_cursor" not in page:
                    return out
                params = {"limit": "1000", "cursor": page["next_cursor"]}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=100.0, help="events per second into relay A")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=30.0, help="B's poll interval of A (seconds)")
    ap.add_argument("--keep", metavar="DIR", help="keep the relays' data and logs in DIR (default: a temporary one)")
    args = ap.parse_args()
    total = int(args.rate * args.seconds)

    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        a, b = Relay(root, "a"), Relay(root, "b")
        peers = root / "b-peers.toml"
        peers.write_text(f'[[peer]]\norigin = "{a.origin}"\nca_file = "{a.cert}"\nallow_private = true\n'
                         f"interval = {args.interval!r}\n", encoding="utf-8")
        try:
            a.start()
            b.start("--peers", str(peers))
            signer = Signer.from_seed(b"\x5a" * 32)
            rng = random.Random(5)
            events = [make_event(signer, i + 1, rng) for i in range(total + 1)]
            hashes = [json.loads(e)["hash"] for e in events]
            with a.client() as client:  # a first event: B has subscribed once it has it (its poll is far off)
                assert client.post("/v1/knowledge/events", content=events[0],
                                   headers={"content-type": "application/json"}).status_code == 200
            wait_until(lambda: hashes[0] in b.accepted(), 60, "B's subscription")
            load_before = os.getloadavg()
            local = threading.local()
            clients: list[httpx.Client] = []

            def send(i: int, at: float) -> None:
                client = getattr(local, "client", None)
                if client is None:
                    client = local.client = a.client()
                    clients.append(client)
                delay = at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                r = client.post("/v1/knowledge/events", content=events[i], headers={"content-type": "application/json"})
                assert r.status_code == 200, r.text

            start = time.monotonic() + 0.5
            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(send, i, start + (i - 1) / args.rate) for i in range(1, total + 1)]
                for f in futures:
                    f.result()
            sent_s = time.monotonic() - start
            for client in clients:
                client.close()
            load_after = os.getloadavg()
            wanted = set(hashes[1:])
            wait_until(lambda: wanted <= set(b.accepted()), 120, "every event on B")
            there, here = a.accepted(), b.accepted()
            delays = [float(here[h] - there[h]) for h in hashes[1:]]
        finally:
            b.stop()
            a.stop()

    print(f"{total} events into A at {total / sent_s:.0f}/s (asked {args.rate:g}/s); B polls A every "
          f"{args.interval:g} s and subscribes to its push stream")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min); {os.cpu_count()} cores")
    print(f"push_propagation_mean: {statistics.fmean(delays):.1f} ms, max {max(delays):.0f} ms")
    print(f"push_propagation_p50: {percentile(delays, 0.50):.0f} ms (goal <= 100 ms)")
    print(f"push_propagation_p99: {percentile(delays, 0.99):.0f} ms (goal <= 500 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
