"""Soak: mixed good and bad traffic against a 2-worker relay, for a bounded time.

Starts ``akrelay serve --workers 2`` on 127.0.0.1 (a free port, a temporary
data directory, rate limits off, a short ``--body-timeout``) and runs
``--clients`` concurrent loops for ``--duration`` seconds. Each request is one
traffic class, taken in a fixed weighted rotation, on its own TLS connection:

* good: signed submissions, discovery, query, batch, HEAD on GET resources;
* bad bodies: malformed JSON, oversized bodies (300 KB, 2 MB), malformed
  chunked framing, a client closing mid-body, a stalled body;
* KIP: bad JSON (duplicate member names, ``1e400``) and hostile queries:
  ``OPTIONAL``/``NOT`` nested 200-300 deep, object and array literals 200-300
  deep, a FILTER of 400 ``&&`` terms, a pathological REGEX, a nested NOT over a
  cartesian product.

Every request has a client-side deadline (``--request-timeout``), so the run
ends on time even if the relay does not answer: within ``--duration`` +
``--request-timeout`` + 30 s (the relay's shutdown, then SIGKILL), after the
relay's start. At the end it reports, per
class, the outcomes (HTTP status or client-side error) and the unexpected
ones; the 5xx count; tracebacks and error lines in the relay's log; the
slowest discovery answer (a worker that stops answering others shows here); and
the relay's RSS (its process tree) after warm-up and at the end. The 5xx count
is the larger of the 5xx answers clients saw and the 500s the relay logged
(a client that timed out first never sees its 500).

Goals: 0 5xx, 0 tracebacks, RSS growth after warm-up <= 10 %.

Usage: python bench/soak.py [--duration 60] [--clients 8] [--skip kip_regex,kip_cartesian] [--check]
Last line: ``soak_5xx: <n> count``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from akrelay.protocol.signer import Signer, publish_event  # noqa: E402
from bench_ingest import free_port  # noqa: E402

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
EVENTS, BATCH, SEARCH, KIP, DISCOVERY, QUERY = ("/v1/knowledge/events", "/v1/knowledge/batch",
                                                "/v1/knowledge/search", "/v1/kip",
                                                "/.well-known/agent-knowledge", "/v1/knowledge/query")
POST_ROUTES = (EVENTS, BATCH, SEARCH, KIP)


# -- the relay --------------------------------------------------------------------------------------


@dataclass
class Relay:
    proc: subprocess.Popen
    port: int
    cert: Path
    log: Path

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


def start_relay(root: Path, workers: int, body_timeout: float) -> Relay:
    data = root / "data"
    port = free_port()
    log = root / "serve.log"
    args = [sys.executable, "-m", "akrelay", "serve", "--data", str(data), "--host", "127.0.0.1",
            "--port", str(port), "--workers", str(workers), "--write-rate", "0", "--read-rate", "0",
            "--body-timeout", str(body_timeout)]
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
                status, _, _ = asyncio.run(request(relay, b"GET " + DISCOVERY.encode() + b" HTTP/1.1\r\n"
                                                   b"Host: localhost\r\nConnection: close\r\n\r\n", 5.0))
                if status == 200:
                    time.sleep(1.0)  # let the second worker finish starting too
                    return relay
            except (OSError, asyncio.TimeoutError, ValueError):
                pass
        time.sleep(0.3)
    stop_relay(relay)
    raise SystemExit("akrelay serve did not answer within 120 s")


def stop_relay(relay: Relay) -> None:
    try:
        os.killpg(relay.proc.pid, signal.SIGTERM)
        relay.proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(relay.proc.pid, signal.SIGKILL)
        relay.proc.wait(timeout=30)


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (Granian's main process and workers)."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status", "rb") as fh:
                total += next((int(line.split()[1]) * 1024 for line in fh if line.startswith(b"VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", "rb") as fh:
                    pending.extend(int(child) for child in fh.read().split())
        except (OSError, ValueError):
            continue
    return total


# -- a minimal HTTP/1.1 client over TLS -----------------------------------------------------------


async def request(relay: Relay, head_and_body: bytes, timeout: float, *,
                  then: Callable[[asyncio.StreamWriter], Awaitable[None]] | None = None,
                  head: bool = False) -> tuple[int, dict[str, str], bytes]:
    """Send bytes on a fresh TLS connection and read one response (status, headers, body)."""

    async def exchange() -> tuple[int, dict[str, str], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port, ssl=relay.context(),
                                                       server_hostname="localhost")
        try:
            writer.write(head_and_body)
            await writer.drain()
            if then is not None:
                await then(writer)
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("closed without an answer")
            status = int(status_line.split(b" ", 2)[1])
            headers: dict[str, str] = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            body = b"" if head else await reader.readexactly(length)
            return status, headers, body
        finally:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 2)
            except Exception:
                pass

    return await asyncio.wait_for(exchange(), timeout)


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n").encode() + body


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()


def kip(command: str) -> bytes:
    return json.dumps({"kip": "2.0", "operations": [{"language": "KQL", "command": command}]}).encode()


# -- traffic classes --------------------------------------------------------------------------------


class Traffic:
    """Every class: ``name -> (weight, coroutine factory, expected statuses or None for 'no answer')``."""

    def __init__(self, relay: Relay, args: argparse.Namespace) -> None:
        self.relay = relay
        self.args = args
        self.nonce = itertools.count(1)
        self.accepted: list[tuple[str, bytes]] = []
        self.rotation = itertools.count()  # variants within a class
        self.turns = itertools.count()  # the class schedule: its own counter, so variant picks cannot skew it
        big = 2_000_000
        self.oversized = [b'{"pad":"' + b"x" * (300_000 - 10) + b'"}', b'{"pad":"' + b"x" * (big - 10) + b'"}']
        self.classes: dict[str, tuple[int, Callable[[], Awaitable[Any]], set[int] | None]] = {
            "submit": (6, self.submit, {200}),
            "discovery": (4, lambda: self.send(get(DISCOVERY)), {200}),
            "query": (3, lambda: self.send(get(QUERY + "?limit=20")), {200}),
            "batch": (2, self.batch, {200}),
            "head": (2, lambda: self.send(get(DISCOVERY, "HEAD"), head=True), {200}),
            "bad_json": (3, self.bad_json, {400}),
            "oversized": (2, self.oversize, {413}),
            "chunked_malformed": (3, self.chunked, {400}),
            "midbody_close": (3, self.midbody_close, None),
            "stalled_body": (1, self.stalled, {408}),
            "kip_bad_json": (2, self.kip_bad_json, {400}),
            "kip_deep": (2, self.kip_deep, {200, 400, 422}),
            "kip_filter_400": (1, lambda: self.send(post(KIP, kip(
                'FIND(?c) WHERE { ?c {type: "Agent"} FILTER(' + " && ".join(["true"] * 400) + ") }"))),
                {200, 400, 422}),
            "kip_regex": (1, lambda: self.send(post(KIP, kip(
                'FIND(?c) WHERE { ?c {type: "Agent"} FILTER(REGEX("' + "a" * 200 + '", "^(a|a){1,27}c")) }'))),
                {200, 400, 422}),
            "kip_cartesian": (1, lambda: self.send(post(KIP, kip(
                'FIND(?a) WHERE { ?a {type: "KnowledgeCapsule"} NOT { ?b {type: "KnowledgeCapsule"} '
                '?c {type: "KnowledgeCapsule"} NOT { ?d {type: "KnowledgeCapsule"} '
                'FILTER(?d.name == ?b.name && ?c.name == ?a.name) } } }'))), {200, 400, 422}),
        }
        for name in args.skip:
            if name not in self.classes:
                raise SystemExit(f"--skip: unknown class {name!r} (classes: {', '.join(self.classes)})")
            del self.classes[name]
        self.schedule = [name for name, (weight, _, _) in self.classes.items() for _ in range(weight)]

    def next_class(self) -> str:
        return self.schedule[next(self.turns) % len(self.schedule)]

    async def send(self, data: bytes, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        return await request(self.relay, data, self.args.request_timeout, **kw)

    async def submit(self) -> Any:
        """A new signed publication (each from a fresh agent, so order never matters) until
        ``--distinct`` were accepted, then exact resubmissions of those (also 200): the store
        stops growing, so RSS growth after warm-up measures leaks, not data."""
        if len(self.accepted) >= self.args.distinct:
            return await self.send(post(EVENTS, self.accepted[next(self.rotation) % len(self.accepted)][1]))
        signer = Signer.from_seed(os.urandom(32))
        n = next(self.nonce)
        payload = {"license": LICENSE, "kind": "observation", "title": f"Soak item {n}",
                   "statement": f"Soak statement {n} about mixed traffic.", "language": "en",
                   "context": {"scope": "soak", "conditions": [], "limitations": []},
                   "basis": "Synthetic soak traffic.", "tags": ["soak"]}
        envelope = signer.sign(publish_event(signer.agent_id, time.time_ns() // 1_000_000 - 1000, 1, payload))
        raw = json.dumps(envelope).encode()
        result = await self.send(post(EVENTS, raw))
        if result[0] == 200:
            self.accepted.append((envelope["hash"], raw))
        return result

    async def batch(self) -> Any:
        hashes = [h for h, _ in self.accepted[-20:]] or ["A" * 43]
        return await self.send(post(BATCH, json.dumps({"hashes": hashes}).encode()))

    async def bad_json(self) -> Any:
        path = POST_ROUTES[next(self.rotation) % 3]  # events, batch, search (KIP has its own class)
        return await self.send(post(path, b'{"hashes": [' if path != EVENTS else b'{"event": {"type": "x"'))

    async def oversize(self) -> Any:
        body = self.oversized[next(self.rotation) % 2]
        return await self.send(post(POST_ROUTES[next(self.rotation) % 4], body))

    async def chunked(self) -> Any:
        framing = (b"ZZZ\r\n{}\r\n0\r\n\r\n", b"ffffffffffffffffff\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n")
        n = next(self.rotation)
        head = (f"POST {POST_ROUTES[n % 4]} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
        return await self.send(head + framing[n % 3])

    async def midbody_close(self) -> Any:
        path = POST_ROUTES[next(self.rotation) % 4]
        head = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000\r\n\r\n").encode()

        async def exchange() -> str:
            _, writer = await asyncio.open_connection("127.0.0.1", self.relay.port, ssl=self.relay.context(),
                                                      server_hostname="localhost")
            writer.write(head + b"x" * 200)
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.transport.abort()  # gone without a word
            return "closed"

        return await asyncio.wait_for(exchange(), self.args.request_timeout)

    async def stalled(self) -> Any:
        head = (f"POST {POST_ROUTES[next(self.rotation) % 4]} HTTP/1.1\r\nHost: localhost\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
        return await self.send(head + b"x" * 200)

    async def kip_bad_json(self) -> Any:
        bodies = (b'{"kip": "2.0", "kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER"}]}',
                  b'{"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER", "parameters": {"n": 1e400}}]}')
        return await self.send(post(KIP, bodies[next(self.rotation) % 2]))

    async def kip_deep(self) -> Any:
        n = next(self.rotation) % 4
        if n == 0:
            inner = '?c {type: "Agent"}'
            for _ in range(200):
                inner = f"OPTIONAL {{ {inner} }}"
            command = f'FIND(?c) WHERE {{ ?c {{type: "Agent"}} {inner} }}'
        elif n == 1:
            inner = '?d {type: "Agent"}'
            for _ in range(300):
                inner = f"NOT {{ {inner} }}"
            command = f'FIND(?c) WHERE {{ ?c {{type: "Agent"}} {inner} }}'
        elif n == 2:
            command = 'FIND(?c) WHERE { ?c {type: "Agent", name: ' + "{a: " * 200 + "1" + "}" * 200 + "} }"
        else:
            command = 'FIND(?c) WHERE { ?c {type: "Agent", name: ' + "[" * 300 + "1" + "]" * 300 + "} }"
        return await self.send(post(KIP, kip(command)))


def outcome_of(result: Any) -> str:
    if isinstance(result, tuple):
        return str(result[0])
    return str(result)


def error_name(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "incomplete_answer"
    if isinstance(exc, ssl.SSLError):
        return "ssl_" + type(exc).__name__
    return type(exc).__name__


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: dict[str, collections.Counter]
    slowest_discovery: float = 0.0
    rss_warm: int = 0
    requests: int = 0


async def client_loop(traffic: Traffic, tally: Tally, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        name = traffic.next_class()
        _, factory, _ = traffic.classes[name]
        started = time.monotonic()
        try:
            outcome = outcome_of(await factory())
        except Exception as exc:  # the point of a soak: classify, keep going
            outcome = error_name(exc)
        if name == "discovery":
            tally.slowest_discovery = max(tally.slowest_discovery, time.monotonic() - started)
        tally.outcomes[name][outcome] += 1
        tally.requests += 1


async def soak(traffic: Traffic, relay: Relay, args: argparse.Namespace) -> Tally:
    tally = Tally(collections.defaultdict(collections.Counter))
    started = time.monotonic()
    stop_at = started + args.duration
    loops = [asyncio.create_task(client_loop(traffic, tally, stop_at)) for _ in range(args.clients)]
    await asyncio.sleep(min(args.warmup, args.duration))
    tally.rss_warm = tree_rss_bytes(relay.proc.pid)
    print(f"  warm-up done after {args.warmup:.0f} s: relay RSS {tally.rss_warm / 2**20:.1f} MiB, "
          f"{tally.requests} requests", flush=True)
    await asyncio.gather(*loops)
    return tally


def log_findings(log: Path) -> tuple[int, int, int, str]:
    """Tracebacks, 500s the relay answered (one "unhandled error" line each), ERROR lines,
    and the first traceback (to show), in the relay's log."""
    text = log.read_text("utf-8", "replace")
    lines = text.splitlines()
    answered_500 = sum("unhandled error on" in line for line in lines)
    errors = [line for line in lines if line.startswith("ERROR") or "[ERROR]" in line]
    marker = "Traceback (most recent call last)"
    first = ""
    if marker in text:
        at = text.index(marker)
        first = "\n".join(text[max(0, text.rfind("\n", 0, at - 1)):].splitlines()[:40])
    return text.count(marker), answered_500, len(errors), first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (default 60)")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before the RSS baseline (default 15)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent client loops (default 8)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--body-timeout", type=float, default=2.0, help="the relay's --body-timeout (default 2)")
    parser.add_argument("--distinct", type=int, default=300,
                        help="distinct submissions before resubmitting them (default 300)")
    parser.add_argument("--request-timeout", type=float, default=20.0, help="client deadline per request")
    parser.add_argument("--skip", default="", type=lambda text: [s for s in text.split(",") if s],
                        help="comma-separated classes to leave out")
    parser.add_argument("--keep-log", metavar="PATH", help="copy the relay's log here at the end")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.duration > 3600:
        raise SystemExit("--duration must be in (0, 3600] seconds")
    with tempfile.TemporaryDirectory(prefix="akrelay-soak-") as tmp:
        relay = start_relay(Path(tmp), args.workers, args.body_timeout)
        try:
            traffic = Traffic(relay, args)
            print(f"soak: {args.duration:.0f} s, {args.clients} clients, {args.workers} workers on 127.0.0.1:"
                  f"{relay.port}, classes: {', '.join(traffic.classes)}", flush=True)
            tally = asyncio.run(soak(traffic, relay, args))
            rss_end = tree_rss_bytes(relay.proc.pid)
            alive = relay.proc.poll() is None
        finally:
            stop_relay(relay)
        tracebacks, logged_500, error_lines, first_traceback = log_findings(relay.log)
        if args.keep_log:
            shutil.copyfile(relay.log, args.keep_log)
    fivexx = 0
    print(f"{'class':<18} {'requests':>8}  outcomes (status or client-side error)   unexpected")
    for name, (_, _, expected) in traffic.classes.items():
        counts = tally.outcomes.get(name, collections.Counter())
        fivexx += sum(n for outcome, n in counts.items() if outcome.isdigit() and outcome.startswith("5"))
        want = {str(s) for s in expected} if expected is not None else {"closed"}
        unexpected = sum(n for outcome, n in counts.items() if outcome not in want)
        shown = ", ".join(f"{outcome}: {n}" for outcome, n in counts.most_common())
        print(f"{name:<18} {sum(counts.values()):>8}  {shown:<40} {unexpected}")
    growth = (rss_end - tally.rss_warm) / tally.rss_warm * 100 if tally.rss_warm else float("nan")
    print(f"requests: {tally.requests} in {args.duration:.0f} s; relay alive at the end: {alive}")
    print(f"slowest discovery answer: {tally.slowest_discovery:.2f} s")
    if first_traceback:
        print(f"first traceback in the relay's log:\n{first_traceback}")
    print(f"relay log: {tracebacks} tracebacks, {logged_500} answered 500 (unhandled error), "
          f"{error_lines} other error lines")
    # A 500 whose client had given up is only in the log; a plain one from Granian only on the wire.
    print(f"5xx seen by clients: {fivexx}; counted: the larger of that and the log's")
    fivexx = max(fivexx, logged_500)
    print(f"relay RSS: {tally.rss_warm / 2**20:.1f} MiB after warm-up, {rss_end / 2**20:.1f} MiB at the end "
          f"({growth:+.1f} %, goal <= 10 %)")
    print(f"soak_5xx: {fivexx} count")
    missed = fivexx or tracebacks or not alive or growth > 10
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
