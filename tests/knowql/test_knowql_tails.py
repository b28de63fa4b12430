"""Event-stream tails wake on events instead of polling the store (issue 24, item 4)."""

from __future__ import annotations

import threading

import anyio
import pytest

from akrelay.knowql import sse
from akrelay.knowql.redis_store import RedisTurnStore
from akrelay.knowql.store import SqliteTurnStore


def _query(qid: str) -> dict:
    return {"id": qid, "object": "query", "status": "in_progress", "_started": 0.0, "_timeout": 900, "error": None}


class Counting:
    """A store wrapper that counts the tail's reads."""

    def __init__(self, store) -> None:
        self.store, self.reads = store, 0
        self.wakeups = store.wakeups

    def events(self, *args):
        self.reads += 1
        return self.store.events(*args)

    def get_query(self, *args):
        return self.store.get_query(*args)


def _tail_wakes(reader, writer, monkeypatch) -> None:
    """A tail on ``reader`` gets an event ``writer`` appends although its fallback poll is 30 s away."""
    monkeypatch.setattr(sse, "FALLBACK_SECONDS", 30.0)
    writer.create_turn({"id": "ses_1", "scope": ["knowledge"]}, "ses_1", _query("qry_1"), deadline=4e9)
    counting = Counting(reader)
    frames: list[bytes] = []

    async def main() -> None:
        parked = anyio.Event()

        async def consume() -> None:
            async for frame in sse.tail(counting, "qry_1"):
                frames.append(frame)
                if b"response.step" in frame:
                    parked.set()

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            with anyio.fail_after(20):
                await anyio.to_thread.run_sync(writer.append_events, "qry_1", [{"type": "response.step"}])
                await parked.wait()
                reads = counting.reads
                await anyio.sleep(0.3)  # idle: a polling tail would read ~20 times here
                assert counting.reads - reads <= 2
                await anyio.to_thread.run_sync(writer.finish, "qry_1", "completed", {})
                while not frames or not frames[-1].startswith(b"event: query"):
                    await anyio.sleep(0.01)

    anyio.run(main)
    assert any(b"response.completed" in f for f in frames)


def test_a_tail_wakes_on_an_event_of_its_own_process(monkeypatch) -> None:
    store = SqliteTurnStore(None)
    try:
        _tail_wakes(store, store, monkeypatch)
    finally:
        store.close()


def test_a_tail_wakes_on_an_event_written_by_another_node(redis_url, monkeypatch) -> None:
    reader, writer = RedisTurnStore.connect(redis_url), RedisTurnStore.connect(redis_url)
    try:
        reader.wakeups.watch("warm-up")  # start the listener before the writes
        channel = reader.wakeups._channel
        _until(lambda: writer._r.pubsub_numsub(channel)[0][1] >= 1)  # subscribed: no publish is missed
        _tail_wakes(reader, writer, monkeypatch)
    finally:
        reader.close()
        writer.close()


def test_wakeups_forget_queries_nobody_tails() -> None:
    store = SqliteTurnStore(None)
    try:
        store.create_turn({"id": "ses_1", "scope": ["knowledge"]}, "ses_1", _query("qry_1"), deadline=4e9)
        for _ in range(100):
            store.append_events("qry_1", [{"type": "response.step"}])
        assert not store.wakeups._versions and not store.wakeups._watchers
    finally:
        store.close()


def _until(condition, seconds: float = 30.0) -> None:
    done = threading.Event()
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        done.wait(0.02)
    pytest.fail("condition not reached")
