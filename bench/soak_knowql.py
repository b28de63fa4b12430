"""KnowQL soak: one client's hostile KnowQL traffic must not hurt another client (issue 24).

Starts ``akrelay serve`` on 127.0.0.1 (a free port, a temporary data directory, the KnowQL
limits at their defaults, an LLM composer pointed at a fake upstream on 127.0.0.1 that
sends keep-alives but no text, or an endless answer), publishes a few capsules, then:

1. quiet: the *other* client (connecting from 127.0.0.2, so it is a different client IP)
   asks ``--asks`` synchronous turns one after the other: its quiet p50/p99;
2. hostile: ``--hostile`` loops for ``--duration`` seconds, in rotation, each attack from a
   client IP of its own (127.0.1.<n>, so that every attack gets a full per-client budget):
   ``$ref`` fan-out shapes (18 and 30 levels), a 45 KB ``allOf`` of 15,000 items, a turn
   flood, background bursts, event-stream tails held open, LLM turns against the
   keep-alive and the endless upstream, a long session continued and read back,
   malformed documents, made-up methods and paths (/metrics labels), the explorer's 404
   and 405 pages, and UTF-16, BOM-prefixed and duplicate-key bodies; meanwhile the other
   client asks again: its loaded p50/p99.

Everything is bounded: each request has a client deadline (``--request-timeout``) and
the run ends after ``--duration`` plus the relay's shutdown. Reports the statuses per
class, the 5xx answers other than 503 (504 would be a synchronous turn timing out: the
hostile LLM turns are background ones, so none is expected), tracebacks and ERROR lines
in the relay's log, the other client's p50/p99 quiet and loaded, and the relay's largest
RSS (its process tree, sampled every 0.5 s).

Goals: 0 5xx other than 503, 0 tracebacks, loaded p99 <= 3x quiet, RSS bounded.

Usage: python bench/soak_knowql.py [--duration 30] [--hostile 6] [--asks 40] [--workers 1]
Last line: ``soak_knowql_5xx: <n> count``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextvars
import itertools
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from akrelay.protocol.signer import Signer, publish_event  # noqa: E402
from bench_ingest import free_port  # noqa: E402
from soak import Relay, log_findings, stop_relay, tree_rss_bytes  # noqa: E402

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
HOSTILE_IP, OTHER_IP = "127.0.0.1", "127.0.0.2"
CLASSES = ("fan_out", "all_of", "flood", "background", "tails", "llm_keepalive", "llm_endless", "long_session",
           "malformed", "odd_methods", "explorer_errors", "loose_json")
HOSTILE_IPS = {name: f"127.0.1.{n + 1}" for n, name in enumerate(CLASSES)}
#: --one-client: every attack from one address (the issue's "one client"), not one address per class
ONE_CLIENT = False
_current_class: contextvars.ContextVar[str] = contextvars.ContextVar("soak_class", default="")
ASK = {"ask": "cache restart", "scope": ["knowledge"]}
UPSTREAM_SECONDS = 60.0
#: The other client starts a turn at most every PACE seconds (an interactive user, within any sane rate).
PACE = 0.5


# -- a fake LLM upstream ----------------------------------------------------------------------------


def fake_upstream() -> ThreadingHTTPServer:
    """Keep-alives and no text, or (when the ask says ENDLESS) an endless stream of text."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            endless = b"ENDLESS" in body
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            end = time.monotonic() + UPSTREAM_SECONDS
            chunk = f"data: {json.dumps({'choices': [{'delta': {'content': 'y' * 8192}}]})}\n\n".encode()
            try:
                while time.monotonic() < end:
                    if endless:
                        self.wfile.write(chunk)
                    else:
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                        time.sleep(0.1)
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- the relay --------------------------------------------------------------------------------------


def start_relay(root: Path, workers: int, llm: str, extra: list[str]) -> Relay:
    data, port, log = root / "data", free_port(), root / "serve.log"
    args = [sys.executable, "-m", "akrelay", "serve", "--data", str(data), "--host", "127.0.0.1",
            "--port", str(port), "--workers", str(workers),  # every rate limit at its default
            "--knowql-llm-base-url", llm, "--knowql-llm-model", "fake", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    relay = Relay(proc, port, data / "tls-cert.pem", log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"akrelay serve exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        if relay.cert.exists():
            try:
                status, _ = asyncio.run(call(relay, "GET", "/healthz", None, 5.0, OTHER_IP))
                if status == 200:
                    time.sleep(1.0)
                    return relay
            except (OSError, asyncio.TimeoutError, ValueError):
                pass
        time.sleep(0.3)
    stop_relay(relay)
    raise SystemExit("akrelay serve did not answer within 120 s")


# -- a minimal HTTP/1.1 client over TLS, from a chosen source address ------------------------------


async def _open(relay: Relay, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    context = ssl.create_default_context(cafile=str(relay.cert))
    return await asyncio.open_connection("127.0.0.1", relay.port, ssl=context, server_hostname="localhost",
                                         local_addr=(source, 0))


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line = await reader.readline()
    if not line:
        raise ConnectionError("closed without an answer")
    status = int(line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            return status, headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


def _request(method: str, path: str, body: Any) -> bytes:
    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
    return (head + "\r\n").encode() + raw


async def call(relay: Relay, method: str, path: str, body: Any, timeout: float, source: str) -> tuple[int, Any]:
    """One request on a fresh connection: (status, decoded JSON body or None)."""

    async def exchange() -> tuple[int, Any]:
        reader, writer = await _open(relay, source)
        try:
            writer.write(_request(method, path, body))
            await writer.drain()
            status, headers = await _head(reader)
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            try:
                return status, json.loads(raw) if raw else None
            except ValueError:
                return status, None
        finally:
            writer.close()

    return await asyncio.wait_for(exchange(), timeout)


async def hold_tail(relay: Relay, query_id: str, seconds: float, source: str) -> int:
    """Open ``GET /queries/{id}/events`` and read it for at most ``seconds``; the status."""
    reader, writer = await _open(relay, source)
    try:
        writer.write(_request("GET", f"/queries/{query_id}/events", None))
        await writer.drain()
        status, _ = await asyncio.wait_for(_head(reader), seconds + 10)
        end = time.monotonic() + seconds
        while status == 200 and time.monotonic() < end:
            try:
                if not await asyncio.wait_for(reader.read(65536), max(0.01, end - time.monotonic())):
                    break
            except asyncio.TimeoutError:
                break
        return status
    finally:
        writer.close()


# -- traffic ------------------------------------------------------------------------------------------


def fan_out(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
                            for i in range(levels)}
    defs[f"d{levels}"] = {"not": {}}
    return {"type": "object", "$defs": defs, "properties": {"answer": {"$ref": "#/$defs/d0"}}}


class Hostile:
    def __init__(self, relay: Relay, args: argparse.Namespace) -> None:
        self.relay, self.args = relay, args
        self.session: str | None = None
        self.classes = list(CLASSES)
        self.turns = itertools.count()

    @staticmethod
    def source() -> str:
        """The class's own client IP (127.0.1.<n>): every attack gets its own per-client budget."""
        if ONE_CLIENT:
            return HOSTILE_IP
        return HOSTILE_IPS.get(_current_class.get(), HOSTILE_IP)

    async def send(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await call(self.relay, method, path, body, self.args.request_timeout, self.source())

    async def fan_out(self) -> int:
        return (await self.send("POST", "/query", {**ASK, "shape": fan_out(18 if next(self.turns) % 2 else 30)}))[0]

    async def all_of(self) -> int:
        return (await self.send("POST", "/query", {**ASK, "shape": {"type": "object", "allOf": [{}] * 15000}}))[0]

    async def flood(self) -> int:
        statuses = await asyncio.gather(*(self.send("POST", "/query", ASK) for _ in range(10)),
                                        return_exceptions=True)
        return max((s[0] for s in statuses if isinstance(s, tuple)), default=0)

    async def background(self) -> int:
        statuses = await asyncio.gather(*(self.send("POST", "/query", {**ASK, "background": True})
                                          for _ in range(30)), return_exceptions=True)
        return max((s[0] for s in statuses if isinstance(s, tuple)), default=0)

    async def tails(self) -> int:
        status, doc = await self.send("POST", "/query", {**ASK, "background": True, "model": "standard",
                                                         "timeout_seconds": 4})
        if status != 202:
            return status
        held = await asyncio.gather(*(hold_tail(self.relay, doc["id"], 3.0, self.source()) for _ in range(20)),
                                    return_exceptions=True)
        return max((s for s in held if isinstance(s, int)), default=0)

    async def llm_keepalive(self) -> int:
        return (await self.send("POST", "/query", {**ASK, "background": True, "model": "standard",
                                                   "timeout_seconds": 3}))[0]

    async def llm_endless(self) -> int:
        return (await self.send("POST", "/query", {"ask": "ENDLESS cache", "scope": ["knowledge"],
                                                   "background": True, "model": "standard",
                                                   "timeout_seconds": 10}))[0]

    async def long_session(self) -> int:
        if self.session is None:
            status, doc = await self.send("POST", "/query", ASK)
            if status != 200:
                return status
            self.session = doc["session_id"]
        status, _ = await self.send("POST", "/query", {"ask": "cache restart again", "session_id": self.session})
        read, _ = await self.send("GET", f"/sessions/{self.session}")
        return max(status, read) if 500 <= max(status, read) else status

    async def malformed(self) -> int:
        bodies: list[Any] = [b"{", [1], {"ask": 7, "scope": ["knowledge"]}, {"ask": "q", "scope": []},
                             {**ASK, "shape": {"type": "object", "pattern": "(a)\\1"}}]
        return (await self.send("POST", "/query", bodies[next(self.turns) % len(bodies)]))[0]


    async def odd_methods(self) -> int:
        """Made-up HTTP methods and paths: each answered 404/405, none adding a metric series (item 16)."""
        n = next(self.turns)
        statuses = [(await self.send(f"M{n:05d}X", "/v1/knowledge/query"))[0],
                    (await self.send("GET", f"/no/such/path/{n}"))[0]]
        return max(statuses)

    async def explorer_errors(self) -> int:
        """The explorer's 404 and 405 (item 17): HTML pages, never a 5xx."""
        n = next(self.turns)
        return max((await self.send("GET", f"/explorer/no/such/page/{n}"))[0],
                   (await self.send("DELETE", "/explorer/"))[0])

    async def loose_json(self) -> int:
        """UTF-16, a byte order mark, duplicate keys (item 18): 400 each."""
        text = json.dumps(ASK)
        bodies = [text.encode("utf-16"), b"\xef\xbb\xbf" + text.encode(), text[:-1].encode() + b', "ask": "again"}']
        return (await self.send("POST", "/query", bodies[next(self.turns) % len(bodies)]))[0]


async def hostile_loop(hostile: Hostile, tally: dict[str, collections.Counter], stop_at: float, start: int) -> None:
    for n in itertools.count(start):
        if time.monotonic() >= stop_at:
            return
        name = hostile.classes[n % len(hostile.classes)]
        _current_class.set(name)
        try:
            outcome = str(await getattr(hostile, name)())
        except (OSError, asyncio.TimeoutError, ConnectionError, ValueError) as exc:
            outcome = type(exc).__name__
        tally[name][outcome] += 1


async def other_client(relay: Relay, count: int, timeout: float, stop_at: float | None = None) -> list[float]:
    """Sequential synchronous turns from another client IP, one per PACE seconds (within its own
    ``--knowql-rate``): their latencies (seconds)."""
    latencies: list[float] = []
    for _ in range(count):
        if latencies:
            await asyncio.sleep(max(0.0, PACE - latencies[-1]))
        if stop_at is not None and time.monotonic() >= stop_at:
            break
        started = time.monotonic()
        try:
            status, doc = await call(relay, "POST", "/query", ASK, timeout, OTHER_IP)
            ok = status == 200 and isinstance(doc, dict) and doc.get("status") == "completed"
        except (OSError, asyncio.TimeoutError, ConnectionError, ValueError):
            ok = False
        # A turn that failed or got no answer counts as the whole client deadline (and as a failure).
        latencies.append(time.monotonic() - started if ok else -timeout)
    return latencies


def other_client_process(port: int, cert: str, count: int, timeout: float, seconds: float | None) -> list[float]:
    """:func:`other_client` in a process of its own: the hostile loops' own CPU does not slow its clock."""
    relay = Relay(None, port, Path(cert), Path(os.devnull))  # type: ignore[arg-type]
    stop_at = time.monotonic() + seconds if seconds is not None else None
    return asyncio.run(other_client(relay, count, timeout, stop_at))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


async def publish(relay: Relay) -> None:
    for n in range(5):
        signer = Signer.from_seed(os.urandom(32))
        payload = {"license": LICENSE, "kind": "observation", "title": f"Cache restart {n}",
                   "statement": f"Restarting worker {n} clears the cache.", "language": "en",
                   "context": {"scope": "soak", "conditions": [], "limitations": []}, "basis": "Synthetic."}
        envelope = signer.sign(publish_event(signer.agent_id, time.time_ns() // 1_000_000 - 1000, 1, payload))
        status, _ = await call(relay, "POST", "/v1/knowledge/events", envelope, 30.0, OTHER_IP)
        if status != 200:
            raise SystemExit(f"publishing answered {status}")


async def run(relay: Relay, args: argparse.Namespace) -> dict[str, Any]:
    await publish(relay)
    await asyncio.sleep(2.0)  # the index catches up
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ProcessPoolExecutor(1)
    other = (relay.port, str(relay.cert))
    await loop.run_in_executor(pool, other_client_process, *other, 5, args.request_timeout, None)  # warm-up
    quiet = await loop.run_in_executor(pool, other_client_process, *other, args.asks, args.request_timeout, None)
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    peak = [tree_rss_bytes(relay.proc.pid)]
    stop_at = time.monotonic() + args.duration

    async def sample() -> None:
        while time.monotonic() < stop_at + 5:
            peak.append(tree_rss_bytes(relay.proc.pid))
            await asyncio.sleep(0.5)

    hostile = Hostile(relay, args)
    sampler = asyncio.ensure_future(sample())
    loops = [hostile_loop(hostile, tally, stop_at, n) for n in range(args.hostile)]
    hostile_task = asyncio.ensure_future(asyncio.gather(*loops, return_exceptions=True))
    await asyncio.sleep(1.0)  # the loaded figures start once the hostile loops run
    loaded = await loop.run_in_executor(pool, other_client_process, *other, 10 ** 6, args.request_timeout,
                                        max(1.0, stop_at - time.monotonic()))
    await hostile_task
    await sampler
    pool.shutdown()
    return {"quiet": quiet, "loaded": loaded, "tally": tally, "rss_start": peak[0], "rss_max": max(peak)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of hostile traffic (default 30)")
    parser.add_argument("--hostile", type=int, default=6, help="concurrent hostile loops (default 6)")
    parser.add_argument("--asks", type=int, default=40, help="the other client's quiet turns (default 40)")
    parser.add_argument("--workers", type=int, default=1, help="relay workers (default 1)")
    parser.add_argument("--one-client", action="store_true",
                        help="send every attack from one address (default: one address per attack class)")
    parser.add_argument("--serve-args", default="", help="more `akrelay serve` options, e.g. '--knowql-rate 2'")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="client deadline per request")
    args = parser.parse_args(argv)
    global ONE_CLIENT
    ONE_CLIENT = args.one_client
    upstream = fake_upstream()
    root = Path(tempfile.mkdtemp(prefix="akrelay-soak-knowql-"))
    relay = start_relay(root, args.workers, f"http://127.0.0.1:{upstream.server_address[1]}/v1",
                        args.serve_args.split())
    try:
        result = asyncio.run(run(relay, args))
    finally:
        stop_relay(relay)
        upstream.shutdown()
    tracebacks, answered_500, errors, first = log_findings(relay.log)
    fivexx = collections.Counter()
    for name, outcomes in sorted(result["tally"].items()):
        print(f"  {name}: {dict(outcomes)}")
        for outcome, n in outcomes.items():
            if outcome.isdigit() and int(outcome) >= 500 and int(outcome) != 503:
                fivexx[outcome] += n
    failures = sum(1 for v in result["quiet"] + result["loaded"] if v < 0)
    quiet, loaded = [abs(v) for v in result["quiet"]], [abs(v) for v in result["loaded"]]
    q50, q99, l50, l99 = (percentile(quiet, 0.5), percentile(quiet, 0.99), percentile(loaded, 0.5),
                          percentile(loaded, 0.99))
    print(f"other client: quiet p50 {q50 * 1000:.0f} ms p99 {q99 * 1000:.0f} ms ({len(quiet)} turns); "
          f"loaded p50 {l50 * 1000:.0f} ms p99 {l99 * 1000:.0f} ms ({len(loaded)} turns); "
          f"p99 ratio {l99 / q99:.2f} (goal <= 3); mean loaded {statistics.mean(loaded) * 1000:.0f} ms; "
          f"{failures} turn(s) failed or unanswered within {args.request_timeout:g} s")
    print(f"relay RSS: {result['rss_start'] / 2**20:.1f} MiB before the hostile phase, "
          f"max {result['rss_max'] / 2**20:.1f} MiB during it")
    print(f"relay log: {tracebacks} traceback(s), {answered_500} answered 500(s), {errors} ERROR line(s)")
    if first:
        print(first)
    total = sum(fivexx.values()) + answered_500
    print(f"soak_knowql_5xx: {total} count")
    return 0


if __name__ == "__main__":
    sys.exit(main())
