"""The one base of every follower of the acceptance log (search indexer, KIP importer, ...).

A follower copies records after its *position* into something derived (an
index, a nexus). The position is durable and kept by the follower's own
target (the Tantivy index's committed position, the nexus head in its SQLite
file), committed with the records it covers, so a restart resumes there.

Waking up: a commit in this process calls :meth:`LogFollower.notify` (the
relay's commit listeners, :meth:`akrelay.relay.core.Relay.on_commit`), so a
follower reacts at once. Commits made by another worker process are not
signalled; the follower polls the store every ``interval`` seconds as the
fallback (one ``checkpoint()`` read: cheap, and bounded lag without any
cross-process signalling channel to keep alive).

Yielding to a burst: the followers' work competes with acceptance for the
CPU (and on a small machine an idle-priority process still slows the workers
down while it runs, see ``docs/architecture.md``). While the log grows faster
than :attr:`LogFollower.burst_rate` records/s, a follower holds off
(:class:`BurstGate`) until the growth stops or its oldest waiting record has
waited :attr:`LogFollower.max_defer` seconds, then takes everything in one
step. Under light load it steps at once, as before.

Failing steps back off exponentially (up to 30 s), except while the store is
unavailable (:class:`StoreUnavailable`): then the back-off stops at one second and
a wake-up ends it, so the follower resumes as soon as the store returns.
"""

from __future__ import annotations

import logging
import threading
import time

from akrelay.store.base import StoreUnavailable

log = logging.getLogger("akrelay.follow")
#: longest wait between two tries while the store is unavailable (seconds)
OUTAGE_RETRY = 1.0
#: Log growth (records/s) from which the relay's followers hold off. Below it they cost
#: little (at ~0.2 ms of CPU per record, 500 records/s is a tenth of a core) and step at once.
BURST_RATE = 500.0
#: The default of :attr:`LogFollower.max_defer`: derived state at most about a second behind
#: during a burst. Like a search engine's refresh interval, a larger value trades freshness
#: during a burst for acceptance on a machine whose cores the followers share.
MAX_DEFER = 1.0


def set_max_defer(seconds: float) -> None:
    """This process's bound on how long a follower holds off during a burst (``--follow-max-defer``).

    Process-wide, like the priority of the followers' process: every follower built
    afterwards (search indexer, KIP importer) takes it; one that sets its own keeps it.
    """
    if not 0 < seconds < float("inf"):
        raise ValueError("max_defer must be a positive, finite number of seconds")
    LogFollower.max_defer = seconds


class BurstGate:
    """When a follower should step while the log grows fast (no I/O, no clock of its own).

    The follower asks :meth:`hold` before each step with the time and the log's
    head. Growth since the previous question at ``rate`` records/s or more is a
    burst: the answer is a pause (seconds) until the growth falls below that
    rate, or until ``max_defer`` seconds after the last step (the bound on how
    long a record waits for the follower). ``0`` means step now.
    """

    def __init__(self, rate: float, max_defer: float, probe: float = 0.1) -> None:
        self.rate = rate
        self.max_defer = max_defer
        self.probe = probe
        self._seen: tuple[float, int] | None = None
        self._last_step = float("-inf")

    def hold(self, now: float, head: int, position: int) -> float:
        """Seconds to wait before asking again, or 0: step now."""
        seen, self._seen = self._seen, (now, head)
        if head <= position:  # nothing new: the step will find nothing, let it say so
            return 0.0
        remaining = self._last_step + self.max_defer - now
        if seen is not None and remaining > 0 and now > seen[0]:
            if (head - seen[1]) / (now - seen[0]) >= self.rate:
                return min(self.probe, remaining)
        self._last_step = now
        return 0.0


class LogFollower:
    """A background loop: ``step()`` until stopped, sleeping when there is nothing new.

    Subclasses implement :meth:`step` (follow what is there; return how many
    records were taken) and may override :meth:`release` (close files, give up
    leadership) and :attr:`min_step_interval` or :meth:`step_interval` (pace commits under load).
    """

    #: the thread's name (one per kind of follower)
    thread_name = "akrelay-follower"
    #: shortest time between two steps that took records (0: no pacing)
    min_step_interval = 0.0
    #: log growth (records/s) from which the follower holds off until the burst ends (0: never)
    burst_rate = 0.0
    #: during a burst, the longest a record waits for the next step (seconds); the relay's
    #: followers take ``serve --follow-max-defer`` (:func:`set_max_defer`)
    max_defer = MAX_DEFER

    def __init__(self, *, interval: float = 0.2) -> None:
        self.interval = interval
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: guards the hand-over of :meth:`release` between :meth:`stop` and a thread it gave up waiting for
        self._state = threading.Lock()
        self._finished = False
        self._orphaned = False
        self._gate = BurstGate(self.burst_rate, self.max_defer) if self.burst_rate > 0 else None

    # -- to implement -------------------------------------------------------------
    def position(self) -> int:
        """The last ``seq`` this follower has durably taken in (its target's own record of it)."""
        raise NotImplementedError

    def step(self) -> int:
        """Follow what the log holds beyond the position; the number of records taken."""
        raise NotImplementedError

    def release(self) -> None:
        """Give back what the follower holds (after its thread ended)."""

    def step_interval(self) -> float:
        """Shortest time before the next step after one that took records (:attr:`min_step_interval`)."""
        return self.min_step_interval

    def log_head(self) -> int | None:
        """The log's committed head, for :class:`BurstGate`; ``None``: do not hold off (not following now)."""
        return None

    # -- lifecycle ----------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._halt.is_set()

    def notify(self) -> None:
        """Something was committed: step without waiting for the poll interval."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._halt.clear()
            self._finished = self._orphaned = False
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop (a step in progress finishes first), then :meth:`release`.

        Releasing while a step still runs would close the target under it (and
        give up leadership to a second writer), so a step that outlasts
        ``timeout`` keeps the thread; the thread itself releases when it ends.
        """
        self._halt.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            with self._state:
                if not self._finished:
                    self._orphaned = True
                    log.warning("%s: a step outlasted %.1f s; it releases when it ends", self.thread_name, timeout)
                    return
        self._thread = None
        self.release()

    def _run(self) -> None:
        try:
            self._follow()
        finally:
            with self._state:
                self._finished = True
                orphaned, self._orphaned = self._orphaned, False
            if orphaned:  # stop() gave up waiting for this thread: release now that the last step is done
                self._thread = None
                self.release()

    def _hold_off(self) -> float:
        """Seconds to wait for a burst to end before the next step (0: step now)."""
        gate = self._gate
        if gate is None or self.error is not None:
            return 0.0
        try:
            head = self.log_head()
            if head is None:
                return 0.0
            return gate.hold(time.monotonic(), head, self.position())
        except Exception:  # noqa: BLE001 - the step meets the same failure and reports it
            return 0.0

    def _follow(self) -> None:
        delay = self.interval
        while not self._halt.is_set():
            pause = self._hold_off()
            if pause > 0:
                self._halt.wait(pause)
                continue
            started = time.monotonic()
            try:
                taken = self.step()
                delay = self.interval
                if self.error is not None:
                    log.info("%s: recovered", self.thread_name)
                    self.error = None
            except Exception as exc:  # noqa: BLE001 - keep following (the log is re-read); report once per outage
                if self.error is None:
                    if isinstance(exc, StoreUnavailable):  # an outage, not a bug: one line, no traceback
                        log.warning("%s: %s; retrying", self.thread_name, exc)
                    else:
                        log.exception("%s: step failed; retrying", self.thread_name)
                self.error = exc
                taken = 0
                if isinstance(exc, StoreUnavailable):
                    # An outage ends by itself: retry at least every OUTAGE_RETRY s (a try while the store is
                    # down fails at once) and at once when woken, since a commit or a renewed commit channel
                    # means the store answers again. A long back-off would leave the derived state stale
                    # for up to its length after the store returned.
                    self._wake.wait(min(delay, OUTAGE_RETRY))
                    self._wake.clear()
                    delay = min(delay * 2, OUTAGE_RETRY)
                    continue
                self._halt.wait(delay)
                delay = min(delay * 2, 30.0)
            if not taken:
                self._wake.wait(self.interval)
                self._wake.clear()
            elif pace := self.step_interval():
                self._halt.wait(max(0.0, pace - (time.monotonic() - started)))
