"""A hostile push stream costs bounded time, memory and work (:mod:`akrelay.federation.push`).

Each peer is a :class:`~tests.federation.hostile.HostilePeer` on a real TLS socket
that advertises a stream and then abuses it: garbage frames, one endless line,
an endless flood of announcements its query never backs, a slow drip. The sync
loop runs in this process (``SyncScheduler.run``) with a poll interval of an
hour, so every query request the peer sees after the first pass was caused by
its stream. The parser itself is checked on byte-level edge cases first.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from typing import Any, Callable, Iterator

import pytest

from akrelay.federation.peers import Peer
from akrelay.federation.push import MAX_LINE, SseParser, StreamError, announced_seq
from akrelay.federation.scheduler import SyncScheduler
from akrelay.federation.state import FederationState
from akrelay.federation.sync import SyncEngine
from akrelay.tls import ensure_self_signed

from .conftest import Author, make_relay
from .hostile import Conn, HostilePeer, Request

STREAM = "/v1/knowledge/stream"
MiB = 1024 * 1024
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- the parser ------------------------------------------------------------------------------------------


def test_parser_frames_split_anywhere_and_any_line_ending() -> None:
    text = b"retry: 1000\r\n: hello\r\n\r\nid: 7\revent: record\rdata: {}\r\rid: 8\nevent: checkpoint\ndata: x\n\n"
    for cut in range(len(text) + 1):
        parser = SseParser()
        frames = parser.feed(text[:cut]) + parser.feed(text[cut:])
        assert frames == [("record", "7", "{}"), ("checkpoint", "8", "x")], cut
    assert [announced_seq(e, i) for e, i, _ in frames] == [7, 8]


@pytest.mark.parametrize("frame", [("message", "1"), ("record", "x"), ("record", ""), ("record", "1" * 17),
                                   ("record", "²")])
def test_frames_without_a_usable_seq(frame: tuple[str, str]) -> None:
    assert announced_seq(*frame) is None


def test_parser_refuses_a_long_line_without_holding_it() -> None:
    parser = SseParser()
    with pytest.raises(StreamError):
        for _ in range(100):
            parser.feed(b"a" * 1024)
    assert len(parser._buffer) <= MAX_LINE + 1024
    with pytest.raises(StreamError):
        SseParser().feed(b"data: " + b"x" * MAX_LINE + b"\n")
    with pytest.raises(StreamError):  # many short data lines in one frame
        SseParser().feed(b"data: xxxxxxxx\n" * (MAX_LINE // 8 + 1))
    with pytest.raises(StreamError):
        SseParser().feed(b"data: \xff\n")


# -- hostile streams against the sync loop -------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[str, str]:
    files = ensure_self_signed(tmp_path_factory.mktemp("tls"), "https://127.0.0.1:1")
    return str(files.cert), str(files.key)


def stream_peer(tls: tuple[str, str], answer: Callable[[HostilePeer, Conn, Request], None]) -> HostilePeer:
    """A peer that advertises a stream and answers it with ``answer``; the rest stays honest."""

    def scenario(peer: HostilePeer, conn: Conn, request: Request) -> bool:
        if request.path != STREAM:
            return False
        peer.note("stream")
        answer(peer, conn, request)
        conn.keep_alive = False
        return True

    peer = HostilePeer(*tls, scenario)
    peer.data.discovery_doc["features"] = ["push"]
    peer.data.discovery_doc["endpoints"]["stream"] = peer.origin + STREAM
    peer.data.add(Author("hostile-stream").publish("Something real"))
    return peer


class Loop:
    """The sync scheduler (``SyncScheduler``) over one peer in a thread, polling once an hour."""

    def __init__(self, peer: HostilePeer, cert: str) -> None:
        self.relay = make_relay()
        self.peer = Peer(origin=peer.origin, ca_file=cert, allow_private=True, interval=3600.0, read_timeout=10.0)
        self.engine = SyncEngine(self.relay, FederationState(), [self.peer])
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=SyncScheduler(self.engine, tick=0.1).run, args=(self.stop_event,),
                                       daemon=True)

    def __enter__(self) -> "Loop":
        self.thread.start()
        return self

    def status(self) -> str:
        return self.engine.push.describe(self.peer.origin)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def queries(peer: HostilePeer) -> int:
    with peer._lock:
        return sum(1 for r in peer.requests if r.path == peer.data.query_path)


def endless(piece: Callable[[int], bytes]) -> Iterator[bytes]:
    i = 0
    while True:
        i += 1
        yield piece(i)


def test_garbage_frames_end_the_connection_and_cost_no_pulls(tls) -> None:
    def garbage(peer: HostilePeer, conn: Conn, request: Request) -> None:
        conn.write(HEAD)
        conn.drip(endless(lambda i: b"event: junk\ndata: %d\n\nnonsense without a colon\n\n" % i), 0.0, limit=30)

    peer = stream_peer(tls, garbage)
    try:
        with Loop(peer, tls[0]) as loop:
            wait_for(lambda: peer.count("stream") >= 2, "a reconnect after the garbage")
            # the status says "pushed" again while a new connection reads, until that one is cut too
            wait_for(lambda: "without an announced seq" in loop.status(), "the garbage's reason in the status")
            assert queries(peer) == 1  # only the first pass: garbage never pulls
            assert loop.relay.store.checkpoint() == 1  # the first pass took the one real event
            with peer._lock:  # every (re)connection resumes from our checkpoint of the peer
                assert {r.params.get("after_seq") for r in peer.requests if r.path == STREAM} == {"1"}
    finally:
        peer.stop()


def test_an_endless_line_is_cut_within_bounded_memory(tls) -> None:
    def huge(peer: HostilePeer, conn: Conn, request: Request) -> None:
        conn.write(HEAD + b"data: ")
        conn.drip(endless(lambda i: b"x" * 65536), 0.0, limit=30)  # 50 MB and more, never a newline

    peer = stream_peer(tls, huge)
    tracemalloc.start()
    try:
        with Loop(peer, tls[0]) as loop:
            wait_for(lambda: "longer than" in loop.status(), "the long line refused")
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        peer.stop()
    assert peak < 16 * MiB, peak


def test_endless_announcements_its_query_never_backs_are_suspended(tls) -> None:
    """A flood coalesces into few passes; a stream that keeps announcing what is not there is dropped."""

    def flood(peer: HostilePeer, conn: Conn, request: Request) -> None:
        conn.write(HEAD)
        conn.drip(endless(lambda i: b"id: %d\nevent: record\ndata: {}\n\n" % (1_000_000 + i)), 0.0, limit=30)

    peer = stream_peer(tls, flood)
    try:
        with Loop(peer, tls[0]) as loop:
            wait_for(lambda: "suspended" in loop.status(), "the lying stream suspended")
            pulled = queries(peer)
            # the first pass, then one per false announcement until the third (flood or not)
            assert 2 <= pulled <= 1 + 3, pulled
            assert loop.relay.store.checkpoint() == 1  # what is really there, verified, nothing else
    finally:
        peer.stop()


def test_a_slow_drip_holds_one_thread_and_stopping_ends_it(tls) -> None:
    def drip(peer: HostilePeer, conn: Conn, request: Request) -> None:
        conn.write(HEAD)
        conn.drip(endless(lambda i: b":"), 0.05, limit=60)  # a comment, one byte at a time, never a line

    peer = stream_peer(tls, drip)
    try:
        loop = Loop(peer, tls[0]).__enter__()
        wait_for(lambda: loop.status() == "pushed", "the dripping stream opened")
        subscriber = [t for t in threading.enumerate() if t.name == f"push {peer.origin}"]
        assert len(subscriber) == 1
        loop.stop()  # ends the blocked read at once (not after the drip's minute)
        assert not loop.thread.is_alive()
        wait_for(lambda: not subscriber[0].is_alive(), "the subscriber thread ended", timeout=10)
        assert queries(peer) == 1
    finally:
        peer.stop()


def test_a_real_announcement_pulls_at_once(tls) -> None:
    """The honest case through the same peer: an announcement of a seq that is there pulls it."""
    author = Author("announced")
    announced = threading.Event()

    def honest(peer: HostilePeer, conn: Conn, request: Request) -> None:
        conn.write(HEAD + b"retry: 1000\n\n")
        announced.wait(30)
        env = author.publish("Announced")
        peer.data.add(env)
        conn.write(b"id: 2\nevent: record\ndata: {}\n\n")
        conn.drip(endless(lambda i: b": heartbeat\n\n"), 0.2, limit=30)

    peer = stream_peer(tls, honest)
    try:
        with Loop(peer, tls[0]) as loop:
            wait_for(lambda: loop.status() == "pushed", "subscribed")
            announced.set()
            wait_for(lambda: loop.relay.store.checkpoint() == 2, "the announced event pulled")
    finally:
        peer.stop()



def test_announcements_during_a_pass_are_not_held_against_it() -> None:
    """Only what was announced before a pass began must be in it; later news is the next pass's."""
    from akrelay.federation.push import PushHub
    from akrelay.federation.transport import PeerFetchError

    def unreachable(peer: Peer) -> Any:
        raise PeerFetchError("network", "the subscriber is not under test here")

    hub = PushHub(unreachable)
    peer = Peer(origin="https://p.example")
    url = peer.origin + STREAM
    stop = threading.Event()
    try:
        hub.after_pass(peer, url, 38, 38, True)
        entry = hub._peers[peer.origin]
        entry.announced = 40
        entry.wake.set()
        assert hub.wait(peer.origin, stop, 30)
        for _ in range(5):  # each pass finds 40; meanwhile the stream announces more (for the next pass)
            entry.announced += 7
            hub.after_pass(peer, url, 40, 40, True)
        assert "suspended" not in hub.describe(peer.origin)
        for _ in range(3):  # announced before the pass began, and still not there
            entry.announced += 1
            entry.wake.set()
            assert hub.wait(peer.origin, stop, 30)
            hub.after_pass(peer, url, 40, 40, True)
        assert "suspended" in hub.describe(peer.origin)
    finally:
        hub.close()


def test_a_one_off_pass_says_the_stream_is_there_but_not_subscribed(tls) -> None:
    peer = stream_peer(tls, lambda p, conn, request: None)
    try:
        state = FederationState()
        engine = SyncEngine(make_relay(), state, [Peer(origin=peer.origin, ca_file=tls[0], allow_private=True)])
        [result] = engine.run_once()
        assert result.ok and state.get(peer.origin).push == "polled (push stream advertised, not subscribed)"
        assert peer.count("stream") == 0  # `akrelay sync --once` never opens the stream
    finally:
        peer.stop()
