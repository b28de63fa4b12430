"""The follower base: woken by a commit in this process, polling only as the fallback; stops cleanly."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from akrelay.service.config import ServiceConfig
from akrelay.service.relay import Relay
from akrelay.store.follow import LogFollower
from akrelay.store.memory import MemoryStore

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "agent-knowledge-1.0.vectors.json")
                     .read_text("utf-8"))


def _relay() -> Relay:
    return Relay(MemoryStore(), ServiceConfig(origin="https://localhost:8443"), clock=lambda: VECTORS["now"],
                 cursor_secret=b"k" * 32)


def _envelope(name: str) -> bytes:
    return json.dumps(VECTORS["fixtures"][name]["envelope"]).encode()


class Recorder(LogFollower):
    """Records the checkpoint it saw at each step; takes nothing (so it always sleeps)."""

    thread_name = "akrelay-test-follower"

    def __init__(self, relay: Relay, *, interval: float) -> None:
        super().__init__(interval=interval)
        self.relay = relay
        self.seen: list[int] = []
        self.reached = threading.Event()
        self.released = False

    def position(self) -> int:
        return 0

    def step(self) -> int:
        self.seen.append(self.relay.checkpoint())
        if self.seen[-1] >= 1:
            self.reached.set()
        return 0

    def release(self) -> None:
        self.released = True


def test_a_commit_wakes_the_follower_without_waiting_for_its_poll_interval() -> None:
    relay = _relay()
    follower = Recorder(relay, interval=600.0)  # polling alone would not step again within the test
    remove = relay.on_commit(follower.notify)
    follower.start()
    try:
        relay.submit(_envelope("original"))
        assert follower.reached.wait(10.0), follower.seen
        assert follower.position() == 0
    finally:
        follower.stop()
        remove()
    assert not follower.is_alive() and follower.released
    assert relay._commit_listeners == []


def test_an_exact_resubmission_notifies_nobody() -> None:
    relay = _relay()
    calls: list[int] = []
    relay.on_commit(lambda: calls.append(1))
    relay.submit(_envelope("original"))
    relay.submit(_envelope("original"))  # nothing created: no wake-up
    assert calls == [1]


def test_a_failing_step_is_reported_once_and_the_loop_keeps_going(caplog) -> None:
    steps: list[int] = []
    done = threading.Event()

    class Flaky(LogFollower):
        thread_name = "akrelay-test-flaky"

        def step(self) -> int:
            steps.append(1)
            if len(steps) >= 3:
                done.set()
                return 0
            raise RuntimeError("broken")

    follower = Flaky(interval=0.01)
    follower.start()
    try:
        assert done.wait(10.0)
    finally:
        follower.stop()
    assert isinstance(follower.error, RuntimeError)
    assert len([r for r in caplog.records if "step failed" in r.getMessage()]) == 1
