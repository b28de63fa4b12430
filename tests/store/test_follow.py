"""The follower base: woken by a commit in this process, polling only as the fallback; stops cleanly."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.store.base import StoreUnavailable
from akrelay.store import follow
from akrelay.store.follow import LogFollower
from akrelay.store.memory import MemoryStore

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "agent-knowledge-1.0.vectors.json")
                     .read_text("utf-8"))


def _relay() -> Relay:
    return Relay(MemoryStore(), RelayConfig(origin="https://localhost:8443"), clock=lambda: VECTORS["now"],
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
        assert follower.reached.wait(60.0), follower.seen
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
        assert done.wait(60.0)
    finally:
        follower.stop()
    assert follower.error is None  # the outage ended: a step succeeded again
    assert len([r for r in caplog.records if "step failed" in r.getMessage()]) == 1


class SlowStep(LogFollower):
    """One step that outlasts ``stop``'s wait; records whether release came before the step ended."""

    thread_name = "akrelay-test-slow-follower"

    def __init__(self) -> None:
        super().__init__(interval=0.01)
        self.in_step = threading.Event()
        self.step_done = threading.Event()
        self.released = threading.Event()
        self.released_during_step = False

    def position(self) -> int:
        return 0

    def step(self) -> int:
        self.in_step.set()
        self._halt.wait(5)  # noqa: SLF001 - hold the step until stop() has given up waiting
        self.step_done.wait(120)
        return 0

    def release(self) -> None:
        self.released_during_step = not self.step_done.is_set()
        self.released.set()


def test_stop_never_releases_under_a_step_that_outlasts_its_wait() -> None:
    follower = SlowStep()
    follower.start()
    assert follower.in_step.wait(60)
    follower.stop(timeout=0.1)
    assert not follower.released.is_set(), "released while the step still ran"
    follower.start()  # no second thread beside the one still in its step
    assert [t.name for t in threading.enumerate()].count(follower.thread_name) == 1
    follower.step_done.set()
    assert follower.released.wait(60), "the thread releases once its step ends"
    assert follower.released_during_step is False
    assert not follower.is_alive() or follower._thread is None  # noqa: SLF001


class Flaky(LogFollower):
    """Fails on chosen calls; otherwise takes nothing."""

    thread_name = "akrelay-test-flaky-follower"

    def __init__(self, failing: set[int], calls: int) -> None:
        super().__init__(interval=0.001)
        self.failing, self.calls, self.count = failing, calls, 0
        self.done = threading.Event()

    def position(self) -> int:
        return 0

    def step(self) -> int:
        self.count += 1
        if self.count >= self.calls:
            self.done.set()
        if self.count in self.failing:
            raise RuntimeError(f"outage at call {self.count}")
        return 0


def test_each_outage_is_reported_once(caplog) -> None:  # noqa: ANN001
    follower = Flaky({1, 3}, calls=4)
    with caplog.at_level("INFO", logger="akrelay.follow"):
        follower.start()
        assert follower.done.wait(10)
        follower.stop()
    failures = [r for r in caplog.records if "step failed" in r.getMessage()]
    assert len(failures) == 2, [r.getMessage() for r in caplog.records]
    assert sum("recovered" in r.getMessage() for r in caplog.records) >= 1
    assert follower.error is None


def test_a_failing_commit_listener_neither_fails_the_commit_nor_skips_the_others(caplog) -> None:  # noqa: ANN001
    relay = _relay()
    woken: list[str] = []
    relay.on_commit(lambda: 1 / 0)
    relay.on_commit(lambda: woken.append("second"))
    name = next(n for n, f in VECTORS["fixtures"].items() if f["envelope"]["event"]["type"] == "knowledge.publish")
    with caplog.at_level("WARNING", logger="akrelay.relay"):
        record, created = relay.submit(_envelope(name))
    assert created and record.seq == 1
    assert woken == ["second"]
    assert any("commit listener" in r.getMessage() and r.exc_info for r in caplog.records)


class Outage(LogFollower):
    """The store is unavailable for the first ``failures`` steps; records when each step ran."""

    thread_name = "akrelay-test-outage-follower"

    def __init__(self, failures: int, *, interval: float) -> None:
        super().__init__(interval=interval)
        self.failures = failures
        self.steps: list[float] = []
        self.stepped = threading.Event()

    def position(self) -> int:
        return 0

    def step(self) -> int:
        self.steps.append(time.monotonic())
        self.stepped.set()
        if len(self.steps) <= self.failures:
            raise StoreUnavailable("the store does not answer")
        return 0


def test_a_store_outage_is_retried_every_second_not_after_a_long_back_off(monkeypatch) -> None:
    """After an outage of any length the follower resumes within ``OUTAGE_RETRY`` (1 s) of the store's return:
    the back-off for other failures (up to 30 s, doubling from the poll interval) does not apply."""
    monkeypatch.setattr(follow, "OUTAGE_RETRY", 0.05, raising=False)  # the bound, shortened for the test
    follower = Outage(failures=4, interval=600.0)  # a doubling back-off would wait 600 s after the first failure
    follower.start()
    try:
        deadline = time.monotonic() + 120  # generous for a loaded machine, far below the back-off
        while len(follower.steps) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        follower.stop()
    assert len(follower.steps) >= 5, f"{len(follower.steps)} tries in 120 s"
    assert follower.error is None


def test_a_wake_up_during_an_outage_retries_at_once(monkeypatch) -> None:
    """A commit (or the commit channel renewed after the outage) means the store answers again."""
    monkeypatch.setattr(follow, "OUTAGE_RETRY", 600.0, raising=False)  # only the wake-up can end the wait within the test
    follower = Outage(failures=1, interval=600.0)
    follower.start()
    try:
        assert follower.stepped.wait(60)
        follower.stepped.clear()
        follower.notify()  # in its wait after the failure, or about to be: a set event ends the wait either way
        assert follower.stepped.wait(120), "the wake-up did not end the wait"
    finally:
        follower.stop()
    assert follower.error is None


def test_an_outage_still_backs_off() -> None:
    """Retrying every second at most is no busy loop: the tries double their spacing up to that second."""
    follower = Outage(failures=10_000, interval=0.01)
    follower.start()
    try:
        deadline = time.monotonic() + 120
        while len(follower.steps) < 9 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        follower.stop()
    # Lower bounds on the spacing only (a loaded machine makes every gap longer, never shorter):
    # 0.01, 0.02, 0.04 ... doubling, then at most OUTAGE_RETRY (1 s) apart.
    gaps = [b - a for a, b in zip(follower.steps, follower.steps[1:9])]
    assert len(gaps) == 8, follower.steps
    for i, gap in enumerate(gaps):
        assert gap >= 0.9 * min(0.01 * 2 ** i, follow.OUTAGE_RETRY), (i, gaps)


# -- yielding to a burst ------------------------------------------------------------------


def test_the_gate_steps_at_once_under_light_load() -> None:
    gate = follow.BurstGate(rate=500.0, max_defer=1.0)
    assert gate.hold(10.0, head=1, position=0) == 0  # the first record after a quiet spell
    assert gate.hold(10.3, head=3, position=1) == 0  # 2 records in 0.3 s: no burst
    assert gate.hold(10.6, head=3, position=3) == 0  # nothing new


def test_the_gate_holds_off_during_a_burst_and_steps_when_it_ends() -> None:
    gate = follow.BurstGate(rate=500.0, max_defer=1.0, probe=0.1)
    assert gate.hold(0.0, head=10, position=0) == 0  # the burst's first records: stepped at once
    assert gate.hold(0.2, head=1000, position=10) > 0  # ~5,000 records/s: hold off
    assert gate.hold(0.3, head=1500, position=10) > 0
    assert gate.hold(0.4, head=1510, position=10) == 0  # growth fell to 100/s: the burst is over


def test_during_a_long_burst_a_record_waits_at_most_max_defer() -> None:
    gate = follow.BurstGate(rate=500.0, max_defer=1.0, probe=0.1)
    assert gate.hold(0.0, head=10, position=0) == 0
    now, head, steps = 0.0, 10, [0.0]
    while now < 5.0:  # 5 s at 5,000 records/s, the gate asked every 0.1 s
        now, head = round(now + 0.1, 1), head + 500
        pause = gate.hold(now, head, position=0)
        assert pause <= 0.1
        if pause == 0:
            steps.append(now)
    assert len(steps) >= 5
    assert max(b - a for a, b in zip(steps, steps[1:])) <= 1.0


class Chaser(LogFollower):
    """Follows a counter that the test advances; records how many records each step took."""

    thread_name = "akrelay-test-chaser"
    burst_rate = 200.0
    max_defer = 0.5

    def __init__(self) -> None:
        super().__init__(interval=0.01)
        self.head = 0
        self.taken = 0
        self.steps: list[int] = []
        self.caught_up = threading.Event()
        self.lock = threading.Lock()

    def log_head(self) -> int:
        return self.head

    def position(self) -> int:
        return self.taken

    def step(self) -> int:
        with self.lock:
            new = self.head - self.taken
            self.taken = self.head
        if new:
            self.steps.append(new)
        if self.taken >= 2000:
            self.caught_up.set()
        return new


def test_a_follower_yields_to_a_burst_then_catches_up() -> None:
    """While the log grows fast the follower takes it in a few large steps (not one per wake-up), and
    it has taken everything soon after the burst ends."""
    follower = Chaser()
    follower.start()
    try:
        for _ in range(200):  # 2,000 records at about 5,000 records/s (sleeps of ~2 ms)
            follower.head += 10
            follower.notify()
            time.sleep(0.002)
        assert follower.caught_up.wait(60.0), follower.steps
    finally:
        follower.stop()
    assert sum(follower.steps) == 2000
    # Unheld, a follower woken at every commit steps about once per commit (~200 steps); held, it
    # steps once per max_defer at most (the burst lasts ~0.4-1 s here; generous on a loaded machine).
    assert len(follower.steps) <= 20, follower.steps


# -- --follow-max-defer: the process-wide bound on holding off during a burst ----------------------------


class _GatedFollower(LogFollower):
    burst_rate = 500.0


def test_set_max_defer_reaches_every_follower_built_afterwards(monkeypatch) -> None:
    monkeypatch.setattr(LogFollower, "max_defer", follow.MAX_DEFER)
    before = _GatedFollower()
    follow.set_max_defer(7.5)
    after = _GatedFollower()
    assert before._gate is not None and before._gate.max_defer == follow.MAX_DEFER
    assert after._gate is not None and after._gate.max_defer == 7.5

    class OwnBound(_GatedFollower):
        max_defer = 0.5

    own = OwnBound()
    assert own._gate is not None and own._gate.max_defer == 0.5


def test_a_longer_max_defer_holds_a_burst_longer() -> None:
    short, long = follow.BurstGate(rate=500.0, max_defer=1.0), follow.BurstGate(rate=500.0, max_defer=30.0)
    for gate in (short, long):
        assert gate.hold(0.0, 0, 0) == 0.0  # nothing new
        assert gate.hold(0.1, 100, 0) == 0.0  # first step
    # the log keeps growing at 1,000 records/s: both hold, until the short bound runs out
    held = {id(short): [], id(long): []}
    for i in range(2, 40):
        now, head = i * 0.1, 100 + (i - 1) * 100
        for gate in (short, long):
            held[id(gate)].append(gate.hold(now, head, 100) > 0)
    assert not all(held[id(short)])  # stepped within about a second
    assert all(held[id(long)])  # still holding after 3.8 s of burst


def test_set_max_defer_refuses_what_is_not_a_positive_finite_number(monkeypatch) -> None:
    monkeypatch.setattr(LogFollower, "max_defer", follow.MAX_DEFER)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        try:
            follow.set_max_defer(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"set_max_defer({bad!r}) was accepted")
    assert LogFollower.max_defer == follow.MAX_DEFER


def test_the_serve_setting_sets_the_bound_where_components_are_built(monkeypatch) -> None:
    from akrelay.node import build_components
    from akrelay.settings import defaults

    monkeypatch.setattr(LogFollower, "max_defer", follow.MAX_DEFER)
    build_components(None, defaults(follow_max_defer=12.0), ())  # type: ignore[arg-type]
    assert _GatedFollower()._gate.max_defer == 12.0  # type: ignore[union-attr]
