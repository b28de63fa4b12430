"""The shared body reader in front of every route, driven at the ASGI level (no sockets, no sleeps beyond 0.2 s)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from akrelay.http.body import DISCARD_LIMIT, BodyReader
from relay_harness import relay_app

POSTS = ("/v1/knowledge/events", "/v1/knowledge/batch")


def scope(path: str, method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "https",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8443),
            "headers": [(b"content-type", b"application/json")] + (headers or [])}


class Peer:
    """A client as the server sees it: body messages to hand out, then (optionally) silence."""

    def __init__(self, chunks: list[bytes], *, stall: bool = False, disconnect: bool = False,
                 linger: bool = False) -> None:
        self.chunks = list(chunks)
        self.stall = stall
        self.disconnect = disconnect
        self.linger = linger  # after the last chunk, wait (as a server does until the client leaves)
        self.reads = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.chunks:
            chunk = self.chunks.pop(0)
            more = bool(self.chunks) or self.stall or self.disconnect
            return {"type": "http.request", "body": chunk, "more_body": more}
        if self.stall or self.linger:
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def code(self) -> str:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))["error"]["code"]


def run(app: Any, path: str, peer: Peer, headers: list[tuple[bytes, bytes]] | None = None) -> Peer:
    asyncio.run(asyncio.wait_for(app(scope(path, headers=headers), peer.receive, peer.send), 60))
    return peer


@pytest.mark.parametrize("path", POSTS)
def test_a_stalled_body_is_answered_408_and_closed_after_the_body_timeout(path) -> None:
    with relay_app(body_timeout=0.2) as h:
        peer = run(h.client.app, path, Peer([b"x" * 200], stall=True), [(b"content-length", b"1000")])
    assert peer.status == 408 and peer.code == "invalid_request"
    assert peer.headers[b"connection"] == b"close"


@pytest.mark.parametrize("path", POSTS)
def test_an_oversized_body_is_read_to_its_end_before_the_413(path) -> None:
    """Answering while the client still sends would make the kernel reset the connection."""
    chunks = [b"x" * 65536] * 32  # 2 MiB, past the 256 KiB limit
    with relay_app() as h:
        declared = run(h.client.app, path, Peer(chunks), [(b"content-length", b"%d" % (65536 * 32))])
        counted = run(h.client.app, path, Peer(chunks))  # chunked: no length announced
    for peer in (declared, counted):
        assert peer.status == 413 and peer.code == "payload_too_large"
        assert peer.reads == len(chunks)  # every chunk read (and dropped) before answering


def test_discarding_is_bounded() -> None:
    chunks = [b"x" * 65536] * (DISCARD_LIMIT // 65536 * 2)
    with relay_app() as h:
        peer = run(h.client.app, POSTS[0], Peer(chunks), [(b"content-length", b"%d" % (65536 * len(chunks)))])
    assert peer.status == 413 and peer.headers[b"connection"] == b"close"
    assert peer.reads <= (262144 + DISCARD_LIMIT) // 65536 + 2


@pytest.mark.parametrize("chunks", [[b"x" * 300_000], [b"x" * 65536] * 5])
def test_an_oversized_body_that_has_ended_is_answered_at_once(chunks) -> None:
    """No read past the body's last message: that read would wait for the client to leave."""
    with relay_app(body_timeout=30.0) as h:
        peer = run(h.client.app, POSTS[0], Peer(chunks, linger=True))
    assert peer.status == 413 and peer.reads == len(chunks)


def test_a_declared_oversize_that_stalls_is_still_413() -> None:
    with relay_app(body_timeout=0.2) as h:
        peer = run(h.client.app, POSTS[0], Peer([b"x" * 1000], stall=True), [(b"content-length", b"5000000")])
    assert peer.status == 413 and peer.code == "payload_too_large"


def test_expect_continue_gets_the_413_without_reading() -> None:
    with relay_app() as h:
        peer = run(h.client.app, POSTS[0], Peer([b"x" * 65536] * 8),
                   [(b"content-length", b"524288"), (b"expect", b"100-continue")])
    assert peer.status == 413 and peer.reads == 0


@pytest.mark.parametrize("path", POSTS)
def test_a_body_that_ends_early_is_a_400_and_nothing_else(path, caplog) -> None:
    with relay_app() as h:
        peer = run(h.client.app, path, Peer([b'{"hashes":'], disconnect=True), [(b"content-length", b"100")])
        assert h.relay.checkpoint() == 0
    assert peer.status == 400 and peer.code == "invalid_request"
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING") or r.exc_info]


def test_a_send_to_a_client_that_left_is_not_an_error(caplog) -> None:
    async def gone(message: dict[str, Any]) -> None:
        raise OSError("transport closed")

    peer = Peer([b"{"], disconnect=True)
    reader = BodyReader(1000, 5.0)
    assert asyncio.run(reader(scope(POSTS[0]), peer.receive, gone)) is None
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING") or r.exc_info]


@pytest.mark.parametrize("path", ["/.well-known/agent-knowledge", "/v1/knowledge/query", "/v1/knowledge/events/x"])
def test_head_is_get_without_the_body(path) -> None:
    with relay_app() as h:
        got = h.client.get(path)
        head = h.client.head(path)
    assert head.status_code == got.status_code != 405
    assert head.content == b"" and int(head.headers["content-length"]) == len(got.content) > 0


def test_head_on_a_post_only_resource_is_405() -> None:
    with relay_app() as h:
        head = h.client.head("/v1/knowledge/batch")
    assert head.status_code == 405 and head.content == b""

