"""The CLI against a hostile relay on 127.0.0.1: nothing it sends makes the client unbounded.

A real TLS server whose answers each test scripts below HTTP semantics (a gzip
bomb, an endless body, an endless event-stream line, headers dripped a byte at a
time). Each test asserts the clear error and that memory stayed bounded
(``tracemalloc``'s peak) or that reading stopped while the server still had more.
"""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import httpx
import pytest

from akrelay.cli import main
from akrelay.client import RelayClient, ResponseError
from akrelay.tls import ensure_self_signed

MiB = 1024 * 1024


class Conn:
    def __init__(self, sock: ssl.SSLSocket, server: "Hostile") -> None:
        self.sock, self.server = sock, server

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.server.events.append("client left")
            return False

    def head(self, status: int, headers: list[tuple[str, str]]) -> bool:
        lines = [f"HTTP/1.1 {status} Scripted", *(f"{k}: {v}" for k, v in headers), "connection: close"]
        return self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def json(self, value: object, status: int = 200) -> None:
        body = json.dumps(value).encode()
        self.head(status, [("content-type", "application/json"), ("content-length", str(len(body)))])
        self.send(body)

    def endless(self, piece: bytes, *, limit: int = 256 * MiB, delay: float = 0.0) -> None:
        """Send ``piece`` again and again until the client leaves (or ``limit`` bytes, or the test ends)."""
        sent = 0
        while sent < limit and not self.server.stopping.is_set():
            if not self.send(piece):
                return
            sent += len(piece)
            if delay:
                time.sleep(delay)
        self.server.events.append("limit reached")


Scenario = Callable[[Conn, str, str], None]


class Hostile:
    """``https://127.0.0.1:PORT``; ``scenario(conn, method, path)`` answers every request."""

    def __init__(self, tls: tuple[str, str], scenario: Scenario) -> None:
        self.scenario = scenario
        self.events: list[str] = []
        self.stopping = threading.Event()
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(*tls)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.origin = f"https://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def discovery(self) -> dict[str, object]:
        return {"protocol": "agent-knowledge/1.0", "service": self.origin}

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                raw, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(30)
            sock = self._ctx.wrap_socket(raw, server_side=True)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next((int(v) for k, _, v in (ln.partition(": ") for ln in lines[1:])
                           if k.lower() == "content-length"), 0)
            while len(body) < length:
                body += sock.recv(65536)
            self.scenario(Conn(sock, self), method, path)
        except (OSError, ValueError):
            return
        finally:
            raw.close()

    def stop(self) -> None:
        self.stopping.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(10)


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[str, str]:
    files = ensure_self_signed(tmp_path_factory.mktemp("tls"), "https://127.0.0.1:1")
    return str(files.cert), str(files.key)


@pytest.fixture
def hostile(tls):
    servers: list[Hostile] = []

    def start(scenario: Scenario) -> Hostile:
        servers.append(Hostile(tls, scenario))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def peak_of(run: Callable[[], object]) -> tuple[object, int]:
    """What ``run`` returns and the peak of Python memory while it ran (server threads included)."""
    tracemalloc.start()
    try:
        result = run()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_gzip_bomb_as_discovery_is_refused_unread(hostile, tls, capsys) -> None:
    bomb = gzip.compress(bytes(200 * MiB), compresslevel=9)  # about 200 KB that inflate to 200 MiB

    def scenario(conn: Conn, method: str, path: str) -> None:
        conn.head(200, [("content-type", "application/json"), ("content-encoding", "gzip"),
                        ("content-length", str(len(bomb)))])
        conn.send(bomb)

    server = hostile(scenario)
    rc, peak = peak_of(lambda: main(["ask", "what?", "--relay", server.origin, "--cacert", tls[0]]))
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "content-encoding 'gzip' was not asked for" in err
    assert peak < 32 * MiB


def test_an_endless_event_stream_line_stops_at_its_cap(hostile, tls, capsys) -> None:
    def scenario(conn: Conn, method: str, path: str) -> None:
        if path.startswith("/.well-known/"):
            conn.json(conn.server.discovery())
        elif conn.head(200, [("content-type", "text/event-stream")]):
            conn.send(b"event: response.output_text.delta\ndata: ")
            conn.endless(b"a" * 65536)

    server = hostile(scenario)
    rc, peak = peak_of(lambda: main(["ask", "what?", "--relay", server.origin, "--cacert", tls[0]]))
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "an event-stream line exceeds 8388608 bytes" in err
    assert peak < 64 * MiB
    assert "limit reached" not in server.events


def test_many_event_lines_are_capped_as_one_event(hostile, tls, capsys) -> None:
    def scenario(conn: Conn, method: str, path: str) -> None:
        if path.startswith("/.well-known/"):
            conn.json(conn.server.discovery())
        elif conn.head(200, [("content-type", "text/event-stream")]):
            conn.endless(b"data: " + b"a" * 65530 + b"\n")  # an event that never ends

    server = hostile(scenario)
    rc, peak = peak_of(lambda: main(["ask", "what?", "--relay", server.origin, "--cacert", tls[0]]))
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "an event's data exceeds 8388608 bytes" in err
    assert peak < 64 * MiB


def test_an_endless_discovery_body_stops_at_its_cap(hostile, tls, capsys) -> None:
    def scenario(conn: Conn, method: str, path: str) -> None:
        if conn.head(200, [("content-type", "application/json")]):
            conn.send(b'{"protocol": "agent-knowledge/1.0", "pad": "')
            conn.endless(b"x" * 65536)

    server = hostile(scenario)
    rc, peak = peak_of(lambda: main(["get", "x" * 43, "--relay", server.origin, "--cacert", tls[0]]))
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "body exceeds 1048576 bytes; reading stopped there" in err
    assert peak < 32 * MiB
    assert "limit reached" not in server.events


def test_a_page_larger_than_the_cap_is_refused(hostile, tls) -> None:
    def scenario(conn: Conn, method: str, path: str) -> None:
        if path.startswith("/.well-known/"):
            conn.json(conn.server.discovery())
        elif conn.head(200, [("content-type", "application/json")]):
            conn.send(b'{"result": [')
            conn.endless(b"{}," * 20000)

    server = hostile(scenario)
    with RelayClient(server.origin, cacert=tls[0], max_body=2 * MiB) as client:
        with pytest.raises(ResponseError, match="body exceeds 2097152 bytes"):
            client.query_page({})
    assert "limit reached" not in server.events


def test_headers_dripped_byte_by_byte_meet_one_deadline(hostile, tls) -> None:
    """Each read gets a byte well within the timeout; only a deadline for the whole request ends it."""
    def scenario(conn: Conn, method: str, path: str) -> None:
        conn.send(b"HTTP/1.1 200 OK\r\n")
        conn.endless(b"x", delay=0.05, limit=600)  # 30 s of one header line

    server = hostile(scenario)
    with RelayClient(server.origin, cacert=tls[0], timeout=1.0) as client:
        with pytest.raises(ResponseError, match=r"no complete response within 1 s \(connection, headers and body\)"):
            client.ensure_discovery()
    deadline = time.monotonic() + 30
    while "client left" not in server.events and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "limit reached" not in server.events


def test_the_constructor_does_no_network_io() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"protocol": "agent-knowledge/1.0", "service": "https://relay.example"})

    client = RelayClient("https://relay.example", transport=httpx.MockTransport(handler))
    assert seen == []
    assert client.ensure_discovery() is not None and client.ensure_discovery() is not None
    assert seen == ["/.well-known/agent-knowledge"]  # read once, when first needed


def test_a_relay_that_ignores_the_coding_on_an_error_is_refused_too(hostile, tls) -> None:
    def scenario(conn: Conn, method: str, path: str) -> None:
        body = gzip.compress(b'{"error": {"code": "x", "message": "y"}}')
        conn.head(500, [("content-type", "application/json"), ("content-encoding", "gzip"),
                        ("content-length", str(len(body)))])
        conn.send(body)

    server = hostile(scenario)
    with RelayClient(server.origin, cacert=tls[0]) as client:
        with pytest.raises(ResponseError, match="content-encoding 'gzip' was not asked for"):
            client.ensure_discovery()


def test_requests_say_they_accept_only_identity(tmp_path: Path) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("accept-encoding"))
        return httpx.Response(200, json={"protocol": "agent-knowledge/1.0", "service": "https://relay.example"})

    RelayClient("https://relay.example", transport=httpx.MockTransport(handler)).ensure_discovery()
    assert seen == ["identity"]


# -- item 12: what a relay sends is shown, never acted on by the terminal -------------------------

#: A title change, a screen clear, a C1 CSI, a carriage return starting a fake line, a bidi override.
HOSTILE_TEXT = "\x1b]0;pwned\x07\x1b[2J\x9b31m\r[ok] verified\u202e\u2028"
UNSAFE = ("\x1b", "\x07", "\x9b", "\r", "\u202e", "\u2028")


def _turn(origin: str) -> dict[str, object]:
    return {"id": "qry_1", "object": "query", "status": "completed", "session_id": "ses_1" + HOSTILE_TEXT,
            "output_text": HOSTILE_TEXT, "error": None,
            "citations": [{"belief": "reproduced" + HOSTILE_TEXT, "source": "kip://x", "title": HOSTILE_TEXT}],
            "akrelay": {"snapshot_seq": 1}}


def _answering(stream: bool) -> Scenario:
    def scenario(conn: Conn, method: str, path: str) -> None:
        if path.startswith("/.well-known/"):
            conn.json(conn.server.discovery())
            return
        doc = _turn(conn.server.origin)
        if not stream:
            conn.json(doc)
            return
        delta = {"type": "response.output_text.delta", "delta": HOSTILE_TEXT + "\nline two"}
        frames = (f"event: response.output_text.delta\ndata: {json.dumps(delta)}\n\n"
                  f"event: query\ndata: {json.dumps(doc)}\n\n").encode()
        conn.head(200, [("content-type", "text/event-stream"), ("content-length", str(len(frames)))])
        conn.send(frames)
    return scenario


def test_ask_shows_escape_sequences_instead_of_sending_them(hostile, tls, capsys) -> None:
    server = hostile(_answering(stream=True))
    assert main(["ask", "what?", "--relay", server.origin, "--cacert", tls[0]]) == 0
    out = capsys.readouterr().out
    assert not [ch for ch in UNSAFE if ch in out], out
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\r[ok] verified\\u202e\\u2028" in out
    assert "\nline two" in out  # the answer's own lines stay lines
    citation = next(line for line in out.splitlines() if line.startswith("[1]"))
    assert "\\r[ok] verified" in citation  # one citation, one line


def test_ask_json_escapes_c1_and_bidi_and_stays_the_same_json(hostile, tls, capsys) -> None:
    server = hostile(_answering(stream=False))
    assert main(["ask", "what?", "--json", "--relay", server.origin, "--cacert", tls[0]]) == 0
    out = capsys.readouterr().out
    assert not [ch for ch in UNSAFE if ch in out], out
    assert json.loads(out) == _turn(server.origin)


def test_get_escapes_a_signed_title(hostile, tls, capsys) -> None:
    from akrelay.protocol.signer import Signer, publish_event

    signer = Signer.from_seed(b"t" * 32)
    envelope = signer.sign(publish_event(signer.agent_id, 1_700_000_000_000, 1, {
        "license": "https://creativecommons.org/licenses/by/4.0/", "kind": "observation", "title": HOSTILE_TEXT,
        "statement": "s", "language": "en", "context": {"scope": "x", "conditions": [], "limitations": []},
        "basis": "b"}))
    record = {"envelope": envelope, "seq": 1, "accepted_at": 1_700_000_000_001}

    def scenario(conn: Conn, method: str, path: str) -> None:
        conn.json(conn.server.discovery() if path.startswith("/.well-known/") else record)

    server = hostile(scenario)
    assert main(["get", "--relay", server.origin, "--cacert", tls[0], "--", envelope["hash"]]) == 0
    out = capsys.readouterr().out
    assert not [ch for ch in UNSAFE if ch in out], out
    assert json.loads(out) == record


def test_a_refusal_message_is_escaped_too(hostile, tls, capsys) -> None:
    def scenario(conn: Conn, method: str, path: str) -> None:
        conn.json({"error": {"code": "rate_limited", "message": HOSTILE_TEXT}}, status=429)

    server = hostile(scenario)
    assert main(["get", "--relay", server.origin, "--cacert", tls[0], "--", "x" * 43]) == 1
    err = capsys.readouterr().err
    assert not [ch for ch in UNSAFE if ch in err], err
    assert err.count("\n") == 1


# -- item 15: a relay reached by another name than its origin ------------------------------------


def test_a_relay_asked_by_another_name_says_which_origin_to_use(hostile, tls, capsys) -> None:
    def scenario(conn: Conn, method: str, path: str) -> None:
        conn.json({"protocol": "agent-knowledge/1.0", "service": "https://localhost:8443"})

    server = hostile(scenario)
    assert main(["get", "--relay", server.origin, "--cacert", tls[0], "--", "A" * 43]) == 3
    err = capsys.readouterr().err
    assert (f"you asked for {server.origin}, but the relay there says its origin is https://localhost:8443"
            in err)
    assert "hint: use --relay https://localhost:8443" in err


def test_the_client_refuses_an_alias_with_the_asked_and_the_claimed_origin() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"protocol": "agent-knowledge/1.0", "service": "https://localhost:8443"})

    client = RelayClient("https://127.0.0.1:8443", transport=httpx.MockTransport(handler))
    with pytest.raises(ResponseError) as caught:
        client.get("A" * 43)
    assert str(caught.value).startswith("you asked for https://127.0.0.1:8443, but the relay there says its "
                                        "origin is https://localhost:8443")


def test_serve_prints_the_origin_to_use_not_the_listen_address_as_a_url() -> None:
    from akrelay.process.launcher import banner
    from akrelay.settings import load_settings

    line = banner(load_settings({"data": "/tmp/d", "host": "127.0.0.1", "port": 8443}, {}))
    assert "serving origin https://localhost:8443 (clients use --relay https://localhost:8443)" in line
    assert "https://127.0.0.1" not in line and "listening on 127.0.0.1:8443" in line


# -- kip and kql --relay read through the same bounded client ------------------------------------


def test_kip_relay_refuses_a_gzip_bomb_unread(hostile, tls, capsys) -> None:
    bomb = gzip.compress(bytes(200 * MiB), compresslevel=9)

    def scenario(conn: Conn, method: str, path: str) -> None:
        conn.head(200, [("content-type", "application/json"), ("content-encoding", "gzip"),
                        ("content-length", str(len(bomb)))])
        conn.send(bomb)

    server = hostile(scenario)
    rc, peak = peak_of(lambda: main(["kip", "DESCRIBE PRIMER", "--relay", server.origin, "--cacert", tls[0]]))
    err = capsys.readouterr().err
    assert rc == 1 and "content-encoding 'gzip' was not asked for" in err, err
    assert peak < 32 * MiB


def test_kql_relay_shows_cells_escaped_one_line_each(hostile, tls, capsys) -> None:
    envelope = {"kip": "2.0", "status": "succeeded",
                "results": [{"status": "succeeded", "result": {"columns": ["?c.name"], "rows": [[HOSTILE_TEXT + "\nfake row"]]}}]}

    def scenario(conn: Conn, method: str, path: str) -> None:
        conn.json(envelope)

    server = hostile(scenario)
    assert main(["kql", "FIND(?c.name) WHERE { ?c {type: \"KnowledgeCapsule\"} }", "--relay", server.origin,
                 "--cacert", tls[0]]) == 0
    out = capsys.readouterr().out
    assert not [ch for ch in UNSAFE if ch in out], out
    assert len(out.splitlines()) == 4  # header, rule, one row, footer
