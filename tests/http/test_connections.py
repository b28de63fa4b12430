"""Connection-level behaviour of a real relay over TLS (issue 11): bodies, HEAD, origin, address.

One relay serves the module (no ``--origin``, a 3 s ``--body-timeout``, rate
limits off). Requests go over real TLS sockets, raw where the framing itself
is under test and through ``http.client`` where a real client's view matters.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time
from typing import Any

import pytest

from relay_harness import Served, hash_of, serve_command, start_relay

#: long enough that a loaded machine's scheduling delays stay well inside it
BODY_TIMEOUT = 3.0
EVENTS = "/v1/knowledge/events"
POST_ROUTES = (EVENTS, "/v1/knowledge/batch", "/v1/knowledge/search", "/v1/kip")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Any:
    relay = start_relay(tmp_path_factory.mktemp("conn") / "data", pass_origin=False,
                        extra=["--write-rate", "0", "--read-rate", "0", "--body-timeout", str(BODY_TIMEOUT)])
    try:
        yield relay
    finally:
        relay.stop()


def tls_socket(served: Served, timeout: float = 10.0) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", served.port), timeout=timeout)
    return served.ssl_context().wrap_socket(raw, server_hostname="localhost")


def read_all(sock: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes (or the socket's timeout)."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, socket.timeout):
            return out + b"<timeout>"
        except (ssl.SSLError, OSError):
            return out + b"<reset>"
        if not chunk:
            return out
        out += chunk


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def exchange(served: Served, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with tls_socket(served) as sock:
        sock.sendall(request)
        return parse(read_all(sock))


def post_head(path: str, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{extra}\r\n").encode()


def error_code(body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc) == {"error"} and doc["error"]["message"], doc
    return doc["error"]["code"]


def log_text(served: Served, offset: int = 0) -> str:
    return served.log.read_bytes()[offset:].decode("utf-8", "replace")


def assert_quiet_log(served: Served, offset: int, requests: int) -> None:
    """No traceback, no 500, at most one line per request since ``offset``."""
    text = log_text(served, offset)
    assert "Traceback" not in text and "unhandled" not in text and "500" not in text, text
    assert len(text.splitlines()) <= requests, text


@pytest.mark.parametrize("size", [300_000, 2_000_000])
def test_an_oversized_body_gets_its_413_while_the_client_is_still_sending(served, size) -> None:
    """A real client writing the whole body reads the 413, never a reset (repeated: it used to fail ~35 %)."""
    body = b'{"pad":"' + b"x" * (size - 10) + b'"}'
    for attempt in range(4):
        for path in (EVENTS, "/v1/knowledge/batch", "/v1/kip"):
            conn = http.client.HTTPSConnection("127.0.0.1", served.port, context=served.ssl_context(), timeout=20)
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                assert response.status == 413, (path, attempt)
                assert error_code(response.read()) == "payload_too_large"
            finally:
                conn.close()


def test_an_oversized_body_announced_with_expect_continue_is_refused_before_it_is_sent(served) -> None:
    request = post_head(EVENTS, "Content-Length: 5000000\r\nExpect: 100-continue\r\n")
    status, headers, body = exchange(served, request)
    assert status == 413 and error_code(body) == "payload_too_large"


@pytest.mark.parametrize("framing", [
    b"ZZZ\r\n{}\r\n0\r\n\r\n",                  # a chunk size that is not hexadecimal
    b"ffffffffffffffffff\r\n{}\r\n0\r\n\r\n",   # a chunk size past 64 bits
    b"2\r\n{}XX0\r\n\r\n",                      # no CRLF after the chunk data
])
def test_malformed_chunked_framing_is_a_json_400_on_every_post_route(served, framing) -> None:
    offset = served.log.stat().st_size
    for path in POST_ROUTES:
        status, headers, body = exchange(served, post_head(path, "Transfer-Encoding: chunked\r\n") + framing)
        assert status == 400, (path, body)
        assert headers["content-type"].startswith("application/json") and error_code(body) == "invalid_request"
    time.sleep(0.2)
    assert_quiet_log(served, offset, len(POST_ROUTES))


def test_a_client_closing_mid_body_is_not_a_server_error(served) -> None:
    offset = served.log.stat().st_size
    count = 0
    for path in POST_ROUTES:
        for _ in range(5):
            with tls_socket(served) as sock:
                sock.sendall(post_head(path, "Content-Length: 1000\r\n") + b"x" * 200)
                time.sleep(0.02)
            count += 1
    time.sleep(0.5)
    assert_quiet_log(served, offset, count)
    status, _, _ = exchange(served, b"GET /.well-known/agent-knowledge HTTP/1.1\r\nHost: localhost\r\n"
                                    b"Connection: close\r\n\r\n")
    assert status == 200


@pytest.mark.parametrize("path", [EVENTS, "/v1/knowledge/batch"])
def test_a_stalled_body_is_timed_out_with_408_and_closed(served, path) -> None:
    with tls_socket(served, timeout=BODY_TIMEOUT + 60) as sock:
        started = time.monotonic()
        sock.sendall(post_head(path, "Content-Length: 1000\r\n") + b"x" * 200)
        raw = read_all(sock)  # returns only when the server closes
        elapsed = time.monotonic() - started
    status, _, body = parse(raw)
    assert status == 408 and error_code(body) == "invalid_request"
    assert BODY_TIMEOUT * 0.8 <= elapsed < BODY_TIMEOUT + 30, elapsed


def test_a_complete_body_within_the_timeout_is_served(served) -> None:
    """Headers first, the body a little later (well below the timeout): an ordinary answer."""
    body = json.dumps({"hashes": [hash_of("original")]}).encode()
    with tls_socket(served) as sock:
        sock.sendall(post_head("/v1/knowledge/batch", f"Content-Length: {len(body)}\r\nConnection: close\r\n"))
        time.sleep(0.25)
        sock.sendall(body)
        status, _, answer = parse(read_all(sock))
    assert status == 200 and json.loads(answer)["missing"] == [hash_of("original")]


@pytest.mark.parametrize("path", ["/.well-known/agent-knowledge", "/v1/knowledge/query",
                                  "/v1/knowledge/events/unknown-id"])
def test_head_answers_like_get_without_a_body(served, path) -> None:
    def ask(method: str) -> tuple[int, dict[str, str], bytes]:
        return exchange(served, f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())

    get_status, get_headers, get_body = ask("GET")
    head_status, head_headers, head_body = ask("HEAD")
    assert head_status == get_status and head_status != 405
    assert head_headers["content-type"] == get_headers["content-type"]
    assert int(head_headers["content-length"]) == len(get_body) > 0
    assert head_body == b""


def test_the_origin_follows_the_port_served_when_not_given(served) -> None:
    status, _, body = exchange(served, b"GET /.well-known/agent-knowledge HTTP/1.1\r\nHost: localhost\r\n"
                                       b"Connection: close\r\n\r\n")
    assert status == 200
    urls: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and value.startswith("https://localhost"):
            urls.append(value)

    walk(json.loads(body))
    assert urls and all(url.startswith(f"https://localhost:{served.port}") for url in urls), urls
    assert len(urls) >= 4  # the origin and the events, query and batch endpoints at least


def test_a_second_relay_on_a_served_address_refuses_to_start(served, tmp_path) -> None:
    second = subprocess.Popen(serve_command(tmp_path / "other", served.port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = second.communicate(timeout=120)
    finally:
        if second.poll() is None:  # it started after all: stop it and its workers
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(timeout=15)
    assert second.returncode == 2, stderr
    assert f"127.0.0.1:{served.port}" in stderr and "already in use" in stderr
    status, _, _ = exchange(served, b"GET /.well-known/agent-knowledge HTTP/1.1\r\nHost: localhost\r\n"
                                    b"Connection: close\r\n\r\n")
    assert status == 200
