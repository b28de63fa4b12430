"""The push stream's server side (:mod:`akrelay.http.stream`): frames, resumption, heartbeats, caps, waking.

The hub's frames are driven directly on an event loop over a real relay (memory
store), so each property is shown without a server; the HTTP route, discovery and
the caps' error bodies are shown once over the real app.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest

from akrelay.http.stream import MAX_ANNOUNCE, StreamHub, parse_position
from akrelay.protocol.discovery import validate_discovery
from akrelay.protocol.errors import ProtocolError

from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay

from .conftest import Author, make_relay, raw


def publish(relay: Any, author: Author, n: int) -> list[dict]:
    envelopes = [author.publish(f"Result {i}") for i in range(n)]
    for env in envelopes:
        relay.submit(raw(env))
    return envelopes


def parse_frames(data: bytes) -> list[dict[str, str]]:
    """Frames as field maps (comments kept under ``:``)."""
    frames = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        frame: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            frame[name or ":"] = value.strip()
        frames.append(frame)
    return frames


class Reader:
    """Takes frames from a hub's stream on the test's loop, chunk by chunk."""

    def __init__(self, hub: StreamHub, after_seq: int) -> None:
        self.frames = hub.frames(after_seq)

    async def next(self, timeout: float = 30.0) -> list[dict[str, str]]:
        return parse_frames(await asyncio.wait_for(self.frames.__anext__(), timeout))

    async def close(self) -> None:
        await self.frames.aclose()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_records_from_after_seq_then_new_ones_on_commit() -> None:
    relay = make_relay()
    author = Author("stream")
    old = publish(relay, author, 3)
    hub = StreamHub(relay, heartbeat=3600)

    async def scenario() -> None:
        hub.enter("c")
        reader = Reader(hub, 1)
        try:
            assert (await reader.next())[0]["retry"] == "1000"
            backlog = await reader.next()
            assert [(f["id"], f["event"]) for f in backlog] == [("2", "record"), ("3", "record")]
            assert json.loads(backlog[0]["data"]) == {"seq": 2, "hash": old[1]["hash"],
                                                      "accepted_at": relay.store.get(old[1]["hash"]).accepted_at}
            # nothing new: the stream waits (no poll) until a commit wakes it
            pending = asyncio.ensure_future(reader.next())
            await asyncio.sleep(0)
            assert not pending.done()
            new = await asyncio.to_thread(publish, relay, author, 1)
            frames = await pending
            assert [(f["id"], json.loads(f["data"])["hash"]) for f in frames] == [("4", new[0]["hash"])]
        finally:
            await reader.close()
            hub.leave("c")

    run(scenario())
    assert hub.open_streams == 0 and relay._commit_listeners == []  # listening only while someone streams


def test_withheld_records_are_not_announced() -> None:
    relay = make_relay()
    envs = publish(relay, Author("withheld"), 3)
    relay.withhold(envs[1]["hash"])
    hub = StreamHub(relay, heartbeat=3600)

    async def scenario() -> list[dict[str, str]]:
        reader = Reader(hub, 0)
        try:
            await reader.next()
            return await reader.next()
        finally:
            await reader.close()

    frames = run(scenario())
    assert [f["id"] for f in frames] == ["1", "3"]
    assert envs[1]["hash"] not in json.dumps(frames)


def test_a_reader_far_behind_gets_one_checkpoint_frame() -> None:
    """Back-pressure: a burst, or a reader resuming from far behind, costs one frame, not a backlog."""
    relay = make_relay()
    publish(relay, Author("burst"), MAX_ANNOUNCE + 5)
    hub = StreamHub(relay, heartbeat=3600)

    async def scenario() -> list[dict[str, str]]:
        reader = Reader(hub, 0)
        try:
            await reader.next()
            return await reader.next()
        finally:
            await reader.close()

    frames = run(scenario())
    head = MAX_ANNOUNCE + 5
    assert frames == [{"id": str(head), "event": "checkpoint", "data": json.dumps({"checkpoint": head})
                       .replace(" ", "")}]


def test_a_slow_reader_finds_the_news_coalesced() -> None:
    """Nothing is queued for a reader that does not read: when it asks again it gets what is new at once."""
    relay = make_relay()
    author = Author("slow")
    hub = StreamHub(relay, heartbeat=3600)

    async def scenario() -> list[dict[str, str]]:
        reader = Reader(hub, 0)
        try:
            await reader.next()
            await asyncio.to_thread(publish, relay, author, MAX_ANNOUNCE + 1)  # while the reader reads nothing
            return await reader.next()
        finally:
            await reader.close()

    frames = run(scenario())
    assert len(frames) == 1 and frames[0]["event"] == "checkpoint" and frames[0]["id"] == str(MAX_ANNOUNCE + 1)


def test_commits_before_the_pollers_first_read_still_wake_the_stream() -> None:
    """Another worker commits after the stream read the checkpoint but before the poller first did.

    The poller has no earlier reading to compare with; its first reading must wake
    the streams anyway, or they wait for the next commit or the heartbeat.
    """
    import threading

    relay = make_relay()
    other = Relay(relay.store, RelayConfig(origin=relay.config.origin), cursor_secret=b"s" * 32)  # "another worker"
    first_read = threading.Event()
    foreign_done = threading.Event()
    store = relay.store

    class Gated:
        """The relay's store, with the poller's first checkpoint read held until the foreign commit."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def checkpoint(self) -> int:
            if threading.current_thread().name == "akrelay-push-poll" and not first_read.is_set():
                first_read.set()
                assert foreign_done.wait(30)
            return store.checkpoint()

    relay.store = Gated()  # type: ignore[assignment]
    hub = StreamHub(relay, heartbeat=3600, poll=0.01)
    author = Author("foreign")

    async def scenario() -> list[dict[str, str]]:
        hub.enter("c")
        reader = Reader(hub, 0)
        try:
            await reader.next()  # the preamble
            pending = asyncio.ensure_future(reader.next())
            for _ in range(100):  # let the stream read the checkpoint (0) and start waiting
                await asyncio.sleep(0)
            assert not pending.done()
            await asyncio.to_thread(first_read.wait, 30)
            env = author.publish("Committed by the other worker")
            await asyncio.to_thread(other.submit, raw(env))  # only ``other``'s listeners hear it
            foreign_done.set()
            return await asyncio.wait_for(pending, 30)
        finally:
            await reader.close()
            hub.leave("c")

    frames = run(scenario())
    assert [(f["id"], f["event"]) for f in frames] == [("1", "record")]


def test_heartbeats_while_idle() -> None:
    relay = make_relay()
    now = [0.0]
    hub = StreamHub(relay, heartbeat=0.05, clock=lambda: now[0])

    async def scenario() -> list[dict[str, str]]:
        reader = Reader(hub, 0)
        try:
            await reader.next()
            now[0] += 1.0  # the heartbeat interval has passed (the stream's clock)
            return await reader.next()
        finally:
            await reader.close()

    assert run(scenario()) == [{":": "heartbeat"}]


def test_caps_per_client_and_per_worker() -> None:
    hub = StreamHub(make_relay(), per_client=2, total=3)
    hub.enter("a")
    hub.enter("a")
    with pytest.raises(ProtocolError) as caught:
        hub.enter("a")
    assert caught.value.code == "rate_limited" and caught.value.http_status == 429
    hub.enter("b")
    with pytest.raises(ProtocolError) as caught:
        hub.enter("c")
    assert caught.value.code == "service_unavailable" and caught.value.http_status == 503
    hub.leave("a")
    hub.enter("c")  # a slot given back is free again
    for client in ("a", "b", "c"):
        hub.leave(client)
    assert hub.open_streams == 0


@pytest.mark.parametrize("value", ["-1", "1.5", "x", "²", " 9" * 9, str(2**53)])
def test_bad_positions_are_invalid_request(value: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_position(value, "after_seq")
    assert caught.value.code == "invalid_request"


# -- over the app -------------------------------------------------------------------------------------------


@pytest.fixture
def app():
    from tests.http.relay_harness import relay_app

    with relay_app(extensions=True, push_streams_per_client=1, push_heartbeat=3600.0) as harness:
        yield harness


def test_discovery_advertises_the_stream(app) -> None:
    doc = app.client.get("/.well-known/agent-knowledge").json()
    assert "push" in doc["features"]
    assert validate_discovery(doc, doc["service"]).stream == doc["service"] + "/v1/knowledge/stream"


def test_refusals_use_the_error_format(app) -> None:
    from tests.http.relay_harness import error_of

    for query, headers in (("?after_seq=5", {}), ("?after_seq=x", {}), ("?limit=3", {}),
                           ("?after_seq=1&after_seq=2", {}), ("", {"last-event-id": "nope"})):
        response = app.client.get("/v1/knowledge/stream" + query, headers=headers)
        assert error_of(response) == (400, "invalid_request"), query
    hub = app.node.sync.push.hub
    hub.enter("testclient")  # the client's one slot is taken
    response = app.client.get("/v1/knowledge/stream")
    assert error_of(response) == (429, "rate_limited") and response.headers["retry-after"] == "5"
    hub.leave("testclient")


def test_discovery_without_the_stream() -> None:
    from tests.http.relay_harness import relay_app

    with relay_app(extensions=True, no_push_stream=True) as harness:
        doc = harness.client.get("/.well-known/agent-knowledge").json()
        assert "push" not in doc.get("features", []) and "stream" not in doc["endpoints"]
        assert harness.client.get("/v1/knowledge/stream").status_code == 404


# -- across nodes: Redis pub/sub -----------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_commit_on_another_node_wakes_the_stream(redis_url: str) -> None:
    from akrelay.relay.config import RelayConfig
    from akrelay.relay.core import open_shared_relay

    config = RelayConfig(origin="https://shared.example")
    one = open_shared_relay(redis_url, config, accept_weak_durability=True)
    two = open_shared_relay(redis_url, config, accept_weak_durability=True)
    one.start()
    author = Author("redis")
    hub = StreamHub(one, heartbeat=3600, poll=3600)  # no checkpoint poll: only pub/sub can wake it

    async def scenario() -> list[dict[str, str]]:
        hub.enter("c")
        reader = Reader(hub, 0)
        try:
            await reader.next()
            pending = asyncio.ensure_future(reader.next())
            await asyncio.sleep(0)
            env = author.publish("Committed by the other node")
            await asyncio.to_thread(two.submit, raw(env))
            return await pending
        finally:
            await reader.close()
            hub.leave("c")

    try:
        frames = run(scenario())
        assert [f["id"] for f in frames] == ["1"]
    finally:
        one.close()
        two.close()


# -- a served relay: the route end to end, and disconnects ---------------------------------------------------


@pytest.mark.slow
def test_served_stream_announces_and_a_disconnect_frees_the_slot(tmp_path) -> None:
    import time

    import httpx

    from tests.http.relay_harness import start_relay

    served = start_relay(tmp_path / "relay", extra=["--write-rate", "0", "--read-rate", "0",
                                                    "--push-streams-per-client", "1"])
    author = Author("served")
    try:
        with httpx.Client(base_url=served.origin, verify=served.ssl_context(), trust_env=False, timeout=30) as client:
            with client.stream("GET", "/v1/knowledge/stream") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.iter_lines()
                assert next(lines) == "retry: 1000"
                refused = client.get("/v1/knowledge/stream")  # the client's one slot is taken
                assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
                env = author.publish("Announced over HTTPS")
                assert client.post("/v1/knowledge/events", content=raw(env),
                                   headers={"content-type": "application/json"}).status_code == 200
                seen = []
                for line in lines:
                    seen.append(line)
                    if line.startswith("data: "):
                        break
                assert "id: 1" in seen and json.loads(seen[-1][6:])["hash"] == env["hash"]
            # the client went away: its slot comes back (the server notices the disconnect), and a
            # reconnecting EventSource's Last-Event-ID wins over the URL's after_seq
            deadline = time.monotonic() + 60
            while True:
                with client.stream("GET", "/v1/knowledge/stream?after_seq=1", headers={"last-event-id": "0"}) as again:
                    if again.status_code == 200:
                        resumed = []
                        for line in again.iter_lines():
                            resumed.append(line)
                            if line.startswith("data: "):
                                break
                        assert "id: 1" in resumed
                        break
                assert time.monotonic() < deadline, "the slot of a disconnected stream was never given back"
                time.sleep(0.2)
    finally:
        served.stop()


@pytest.mark.slow
def test_commits_of_another_worker_reach_the_stream(tmp_path) -> None:
    """SQLite, two workers: a stream hears the other worker's commits through its checkpoint poll."""
    import httpx

    from tests.http.relay_harness import start_relay

    served = start_relay(tmp_path / "relay", workers=2, extra=["--write-rate", "0", "--read-rate", "0",
                                                               "--push-heartbeat", "3600"])  # only wake-ups count
    author = Author("workers")
    envelopes = [author.publish(f"From either worker {i}") for i in range(12)]
    try:
        verify = served.ssl_context()
        with httpx.Client(base_url=served.origin, verify=verify, trust_env=False, timeout=30) as reader:
            with reader.stream("GET", "/v1/knowledge/stream") as stream:
                lines = stream.iter_lines()
                assert next(lines) == "retry: 1000"
                for env in envelopes:  # a new connection each: the kernel spreads them over the workers
                    with httpx.Client(base_url=served.origin, verify=verify, trust_env=False, timeout=30) as c:
                        assert c.post("/v1/knowledge/events", content=raw(env),
                                      headers={"content-type": "application/json"}).status_code == 200
                announced = set()
                for line in lines:
                    if line.startswith("data: "):
                        announced.add(json.loads(line[6:])["hash"])
                        if len(announced) == len(envelopes):
                            break
                assert announced == {e["hash"] for e in envelopes}
    finally:
        served.stop()
