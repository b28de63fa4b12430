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
