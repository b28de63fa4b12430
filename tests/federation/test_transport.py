"""The peer transport on real sockets: checked addresses are the ones dialled, and the
peer's CA file alone decides trust (no respx here)."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading

import pytest

from akrelay.federation.peers import Peer
from akrelay.federation.transport import PeerFetchError, PeerTransport
from akrelay.tls import ensure_self_signed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tls_server(tmp_path):
    """A one-route HTTPS server on 127.0.0.1 whose certificate names ``peer.test``."""
    port = free_port()
    origin = f"https://peer.test:{port}"
    files = ensure_self_signed(tmp_path / "srv", origin)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"protocol": "agent-knowledge/1.0", "service": origin,
                               "host": self.headers.get("host")}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files.cert, files.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield origin, files.cert, tmp_path
    finally:
        server.shutdown()
        server.server_close()


def test_dials_the_checked_address_and_verifies_the_name_with_the_peer_ca(tls_server, monkeypatch) -> None:
    origin, cert, tmp_path = tls_server
    other = ensure_self_signed(tmp_path / "other", "https://peer.test:1").cert
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))
    resolved = []

    def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    peer = Peer(origin=origin, ca_file=str(cert), allow_private=True)
    with PeerTransport(peer, resolver=resolver) as transport:
        doc = transport.get_json(origin + "/.well-known/agent-knowledge")
    assert doc["service"] == origin and doc["host"] == origin.removeprefix("https://")
    assert resolved == ["peer.test", "peer.test"]  # the pre-check, then the dial itself
    # Without the CA file the environment's bundle (which lacks this certificate) does not help.
    with PeerTransport(Peer(origin=origin, allow_private=True), resolver=resolver) as transport:
        with pytest.raises(PeerFetchError, match="network"):
            transport.get_json(origin + "/.well-known/agent-knowledge")
    # A certificate for another name is refused even with the right CA file.
    wrong = Peer(origin=origin, ca_file=str(other), allow_private=True)
    with PeerTransport(wrong, resolver=resolver) as transport:
        with pytest.raises(PeerFetchError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            transport.get_json(origin + "/.well-known/agent-knowledge")


def test_a_dns_answer_that_changes_after_the_check_is_not_dialled(tls_server) -> None:
    origin, cert, _ = tls_server
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])  # public for the check, loopback for the dial

    with PeerTransport(Peer(origin=origin, ca_file=str(cert)), resolver=lambda h, p: next(answers)) as transport:
        with pytest.raises(PeerFetchError) as info:
            transport.get_json(origin + "/.well-known/agent-knowledge")
    assert info.value.kind == "network" and "non-public address 127.0.0.1" in info.value.message


def test_urls_off_the_configured_origin_are_refused_before_any_lookup() -> None:
    looked_up = []
    with PeerTransport(Peer(origin="https://peer.test"), resolver=lambda h, p: looked_up.append(h) or []) as t:
        with pytest.raises(PeerFetchError, match="refused"):
            t.get_json("https://peer.test.evil.example/x")
    assert looked_up == []


# -- a hostile peer at the byte level (see hostile.py) --------------------------


@pytest.fixture
def hostile(tmp_path):
    from .hostile import HostilePeer

    files = ensure_self_signed(tmp_path / "tls", "https://127.0.0.1:1")
    peer = HostilePeer(str(files.cert), str(files.key))
    try:
        yield peer, str(files.cert)
    finally:
        peer.stop()


def scripted(answer):
    def scenario(peer, conn, request) -> bool:
        answer(conn)
        return True
    return scenario


def test_a_header_drip_ends_at_the_request_deadline(hostile) -> None:
    """httpcore's read timeout applies per read; the deadline below it covers the whole request."""
    import time

    peer, cert = hostile

    def drip(conn) -> None:
        if conn.write(b"HTTP/1.1 200 OK\r\nx-drip: "):
            conn.drip((b"a" for _ in range(10**6)), 0.02, limit=120)

    peer.scenario = scripted(drip)
    started = time.monotonic()
    with PeerTransport(Peer(origin=peer.origin, ca_file=cert, allow_private=True, read_timeout=0.5)) as t:
        with pytest.raises(PeerFetchError) as info:
            t.get_json(peer.origin + "/.well-known/agent-knowledge")
    assert info.value.kind == "timeout" and "headers and body" in info.value.message
    # The drip goes on for 120 s, a read every 0.02 s: only the 0.5 s request deadline ends it this soon,
    # with room for a loaded machine (per-read timeouts alone would wait out the whole drip).
    assert time.monotonic() - started < 30.0


def test_content_codings_we_did_not_ask_for_are_refused_unread(hostile) -> None:
    import zlib

    peer, cert = hostile
    inflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    once = inflater.compress(b"\0" * (64 << 20)) + inflater.flush()
    for coding in ("gzip", "GZIP, gzip", "identity, br", "deflate"):
        peer.scenario = scripted(lambda conn, coding=coding: conn.respond(
            200, once, [("content-type", "application/json"), ("content-encoding", coding)]))
        with PeerTransport(Peer(origin=peer.origin, ca_file=cert, allow_private=True)) as t:
            with pytest.raises(PeerFetchError) as info:
                t.get_json(peer.origin + "/.well-known/agent-knowledge")
            assert info.value.kind == "encoding" and coding.lower() in info.value.message, coding
            assert t.bytes_read == 0
    # "identity" is what we asked for, and is fine.
    peer.scenario = scripted(lambda conn: conn.respond(200, b"{}", [("content-encoding", "identity")]))
    with PeerTransport(Peer(origin=peer.origin, ca_file=cert, allow_private=True)) as t:
        assert t.get_json(peer.origin + "/x") == {}


def test_a_body_of_too_many_json_values_is_refused_before_parsing(hostile) -> None:
    peer, cert = hostile
    body = b"[" + b"{}," * 3000 + b"{}]"  # 6,002 values in 9 KB; the cap allows max(4096, bytes / 64)
    peer.scenario = scripted(lambda conn: conn.respond(200, body))
    with PeerTransport(Peer(origin=peer.origin, ca_file=cert, allow_private=True, max_page_bytes=65536)) as t:
        with pytest.raises(PeerFetchError) as info:
            t.get_json(peer.origin + "/x")
    assert info.value.kind == "too_large" and "JSON values" in info.value.message
    with PeerTransport(Peer(origin=peer.origin, ca_file=cert, allow_private=True, max_page_bytes=1 << 20)) as t:
        assert len(t.get_json(peer.origin + "/x")) == 3001


def test_retry_after_is_reported_for_429_and_503_only(hostile) -> None:
    peer, cert = hostile
    for status, expected in ((429, "7"), (503, "7"), (500, None), (502, None)):
        peer.scenario = scripted(lambda conn, status=status: conn.respond(status, b"{}", [("retry-after", "7")]))
        with PeerTransport(Peer(origin=peer.origin, ca_file=cert, allow_private=True)) as t:
            with pytest.raises(PeerFetchError) as info:
                t.get_json(peer.origin + "/x")
        assert info.value.status == status and info.value.retry_after == expected, status


def test_only_the_start_of_an_error_body_is_read(hostile) -> None:
    peer, cert = hostile
    body = b'{"error": {"code": "overloaded", "message": "x"}}' + b" " * (8 << 20)
    peer.scenario = scripted(lambda conn: conn.respond(503, body))
    with PeerTransport(Peer(origin=peer.origin, ca_file=cert, allow_private=True)) as t:
        with pytest.raises(PeerFetchError) as info:
            t.get_json(peer.origin + "/x")
        assert info.value.kind == "server" and "overloaded" in info.value.message
        assert t.bytes_read <= 4096
