"""The reconciliation set kept in memory by a serving process, current as of the last message (issue 26).

Why: a reconciliation of thousands of differences spends most of its time locating bounds
in the store's aggregates, and copying the set (about 1.7 s at 1M items on SQLite) only
once it has read enough to prove the copy worth it (:class:`~akrelay.store.recon.OwnSet`,
:class:`~akrelay.store.recon.ResponderCopy`). A process that serves or syncs for hours
can instead copy the set once, when it starts, and keep the copy current: then every
message of every reconciliation, on both sides, is answered from memory, and the time of
a large reconciliation goes to transferring the events it finds.

How it stays current without a thread per commit: the copy remembers the log ``seq`` it
covers. When a message finds that the store's set (its count and id sum, one aggregate
read inside the message's snapshot) is not the copy's, it merges a few news itself where
it can read them in its snapshot (:meth:`KeptCopy._take_news`); otherwise it is answered
from the aggregates as before, and the keeper thread is woken: it reads the records
accepted since (``recon_news`` or ``iter_records``), merges the fetchable ones into a new
copy (:meth:`PackedItems.merged <akrelay.protocol.reconcile.PackedItems.merged>`; the old
one stays valid for the messages using it) and adopts it if its state is the store's. A set that changed otherwise (a record
withheld or removed, or a seq committed out of order) is copied again, at most once per
:data:`REBUILD_GAP` seconds (and never sooner than ten times the last copy took), so that
churn costs a bounded share of one core. Only a set of at most ``cap`` items is kept
(about 50 bytes an item; twice that for a moment while news is merged in); a larger one is answered from the aggregates.

The owner is the node's sync component (:class:`akrelay.components.sync.SyncComponent`):
:meth:`start` starts the keeper, which copies the set at once; :meth:`stop` stops it.
Nothing here starts in a constructor, and a copy that was never started answers nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from akrelay.protocol.reconcile import Item, PackedItems
from akrelay.store.base import Store, event_hash_bytes
from akrelay.store.recon import SNAPSHOT_CAP, ReconIndex, StoreView, _copy

log = logging.getLogger("akrelay.reconcile")

#: Records read per page while catching up; past :data:`CATCH_UP_MAX` the set is copied again instead.
CATCH_UP_PAGE = 5_000
CATCH_UP_MAX = 200_000
#: Seconds between two copies of the whole set at least (a withholding, a removal, churn).
REBUILD_GAP = 30.0
#: ... and never sooner than this many times the last copy took (a share of one core at most).
REBUILD_FACTOR = 10.0
#: Catch-up attempts per wake-up when commits land between the read of the log and the check.
ATTEMPTS = 3
#: News a message that finds the copy behind merges at once (:meth:`KeptCopy._take_news`); more wake the keeper.
NEWS_AT_ONCE = 1_000
#: Seconds the keeper waits after a failure (a store outage) before it tries again.
RETRY = 5.0


class KeptCopy:
    """The whole set in memory, copied at :meth:`start` and caught up from the log when a message finds it behind."""

    def __init__(self, store: Store, index: ReconIndex, *, cap: int = SNAPSHOT_CAP, rebuild_gap: float = REBUILD_GAP,
                 rebuild_factor: float = REBUILD_FACTOR, clock: Callable[[], float] = time.monotonic,
                 on_copy: Callable[[], None] | None = None) -> None:
        """A copy of the whole set follows another after ``max(rebuild_gap, rebuild_factor * the last one's
        seconds)``; ``on_copy`` is called after each (the node counts them in the metrics)."""
        self.store, self.index, self.cap, self.rebuild_gap, self.clock = store, index, cap, rebuild_gap, clock
        self.rebuild_factor = rebuild_factor
        self.on_copy = on_copy
        #: (the copy, its state, the log seq it covers): swapped whole, read without a lock
        self._held: tuple[PackedItems, tuple[int, int], int] | None = None
        #: the held copy whose news a message merged in vain (a change they do not explain): not tried
        #: again by every message until the keeper holds another one
        self._news_failed: tuple[PackedItems, tuple[int, int], int] | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Condition()
        #: refreshes asked for, and the last of them a finished pass began after (under ``_done``)
        self._asked = self._served = 0
        self._thread: threading.Thread | None = None
        self._rebuild_due = True
        self._next_rebuild = float("-inf")
        #: what the status and the tests read (``answered`` and ``behind`` are statistics: threads may race them)
        self.copies = 0
        self.catch_ups = 0
        self.answered = 0
        #: messages that found the copy behind by a few news and merged them at once (:meth:`_take_news`)
        self.caught_up_inline = 0
        self.behind = 0
        self.last_copy_seconds = 0.0
        self.over_cap = False
        self.error: str | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the keeper; it copies the set at once (a few seconds of one thread at 1M items)."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._rebuild_due, self._next_rebuild = True, float("-inf")  # a restart copies at once
        self._thread = threading.Thread(target=self._run, name="akrelay-recon-copy", daemon=True)
        self._wake.set()
        self._thread.start()

    def stop(self) -> None:
        """Stop the keeper (a copy in progress finishes its statement first) and drop the copy."""
        thread, self._thread = self._thread, None
        self._stopping.set()
        self._wake.set()
        if thread is not None:
            thread.join()
        self._held = None
        with self._done:
            self._done.notify_all()

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def holds(self) -> bool:
        """Whether a copy is held (current or behind): ``False`` while copying, past the cap, or stopped."""
        return self._held is not None

    # -- answering -------------------------------------------------------------------------
    def current(self, view: StoreView) -> PackedItems | None:
        """The copy if it is the set ``view`` reads (call inside the view's snapshot); else ``None``, and catch up."""
        held = self._held
        state = view.state()
        if held is not None and held[1] == state:
            self.answered += 1
            return held[0]
        if self._thread is None:
            return None
        self.behind += 1
        if held is not None:
            merged = self._take_news(held, state)
            if merged is not None:
                self.caught_up_inline += 1
                return merged
        self._wake.set()
        return None

    def _take_news(self, held: tuple[PackedItems, tuple[int, int], int], state: tuple[int, int]) -> PackedItems | None:
        """The copy with the few records accepted since its seq merged in, if that is the store's set (else ``None``).

        Why: while events keep arriving, a message would nearly always find the copy a step
        behind, and be answered from the store. Where the news can be read in the message's
        own snapshot (SQLite's ``recon_news``), and are few (:data:`NEWS_AT_ONCE`), they are
        merged at once (tens of ms at 1M items, about the copying of the columns) and the copy
        answers exactly as the store would; the keeper goes on from the merged copy.
        """
        news = getattr(self.index, "recon_news", None)
        if news is None or held is self._news_failed:
            return None
        copy, _, seq = held
        page: list[tuple[int, Item | None]] = news(seq, NEWS_AT_ONCE + 1)
        merged = (copy.merged([item for _, item in page if item is not None])
                  if page and len(page) <= NEWS_AT_ONCE else None)
        if merged is None or merged.state() != state:
            # no news, too many, or something else changed too (a withholding, a removal): the
            # keeper's to mend, and read in one snapshot the verdict holds until it holds another copy
            self._news_failed = held
            return None
        with self._done:  # never step back: keep whichever of two messages' merges covers more of the log
            if self._held is None or self._held[2] <= page[-1][0]:
                self._held = (merged, state, page[-1][0])
        return merged

    def refresh(self, timeout: float) -> bool:
        """Wake the keeper and wait up to ``timeout`` seconds for it to catch up once; whether it did.

        For an initiator, which is about to read its own set every round: the first message
        is then answered from a current copy rather than from the aggregates.
        """
        if self._thread is None:
            return False
        with self._done:
            self._asked += 1
            target = self._asked  # served only by a pass that begins after this (one under way read the log before)
            self._wake.set()
            deadline = time.monotonic() + timeout  # not ``clock``: a test's frozen clock must not make it wait for ever
            while self._served < target and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(left)
            return self._served >= target

    def status(self) -> dict[str, object]:
        """Its state for tests and a debugger (operators read the metrics and the log): items, copies, catch-ups."""
        held = self._held
        state = ("off" if self._thread is None else "over the cap" if self.over_cap
                 else "copying" if held is None else "kept")
        return {"state": state, "items": held[1][0] if held is not None else 0, "seq": held[2] if held else 0,
                "copies": self.copies, "catch_ups": self.catch_ups, "answered": self.answered,
                "behind": self.behind, "caught_up_inline": self.caught_up_inline,
                "last_copy_seconds": round(self.last_copy_seconds, 3), "cap": self.cap,
                "error": self.error}

    # -- the keeper ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            if self._stopping.is_set():
                break
            self._wake.clear()
            with self._done:
                serving = self._asked
            try:
                self._update()
                self.error = None
            except Exception as exc:  # noqa: BLE001 - a store outage: said, and tried again later
                self.error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("reconciliation copy: %s; answering from the store's aggregates meanwhile", self.error)
                self._stopping.wait(RETRY)
            finally:
                with self._done:
                    self._served = serving
                    self._done.notify_all()

    def _update(self) -> None:
        if self._held is None or (self._rebuild_due and self.clock() >= self._next_rebuild):
            self._rebuild()
            return
        # SQLite reads the news on the snapshot's own connection: the news and the state are
        # then one state of the store, and what the news do not explain is no news at all
        together = hasattr(self.index, "recon_news")
        for _ in range(ATTEMPTS):
            held = self._held
            assert held is not None
            copy, _, seq = held
            if together:
                with self.index.recon_snapshot():
                    news = self._read_news(seq)
                    state = StoreView(self.index).state()
            else:  # the store's reads take locks the snapshot may hold: first the news, then the state
                news = self._read_news(seq)
                with self.index.recon_snapshot():
                    state = StoreView(self.index).state()
            if news is None:
                self._rebuild_due = True
                self._rebuild()  # more news than a copy costs
                return
            fresh, last = news
            if fresh:
                copy = copy.merged(fresh)
                self.catch_ups += 1
            mine = copy.state()
            if last != seq:  # something taken in (the same copy stays the same object: see ``_news_failed``)
                with self._done:  # a message may have merged more news meanwhile (:meth:`_take_news`): keep that
                    if self._held is None or self._held[2] <= last:
                        self._held = (copy, mine, last)
            if mine == state:
                return
            if last == seq or together:  # not the store's set, and no news to explain why: copy again
                self._rebuild_due = True
                self._rebuild()
                return
        # every attempt found news and still not the store's set: commits land between the reads;
        # the copy keeps what it took in, and the next message that finds it behind wakes us again

    def _read_news(self, seq: int) -> tuple[list[Item], int] | None:
        """The fetchable items accepted after ``seq`` and the last seq read; ``None`` past :data:`CATCH_UP_MAX`."""
        fresh: list[Item] = []
        last, read = seq, 0
        while True:
            page = self._news(last)
            if not page:
                return fresh, last
            fresh += [item for _, item in page if item is not None]
            last, read = page[-1][0], read + len(page)
            if read > CATCH_UP_MAX:
                return None
            if len(page) < CATCH_UP_PAGE:
                return fresh, last

    def _news(self, after: int) -> list[tuple[int, Item | None]]:
        """A page of the records after ``after``: ``(seq, item or None when it is not fetchable)``."""
        news = getattr(self.index, "recon_news", None)
        if news is not None:
            page: list[tuple[int, Item | None]] = news(after, CATCH_UP_PAGE)
            return page
        return [(r.seq, None if r.withheld else (r.envelope.created_at, event_hash_bytes(r.id)))
                for r in self.store.iter_records(after, CATCH_UP_PAGE)]

    def _rebuild(self) -> None:
        now = self.clock()
        if now < self._next_rebuild:
            self._rebuild_due = True
            return
        started = time.monotonic()
        seq = self.store.checkpoint()  # before the copy: what follows is caught up next time (merging skips repeats)
        with self.index.recon_snapshot():
            view = StoreView(self.index)
            size, state = view.size(), view.state()
            copy = _copy(self.index, None, None, size, self.cap) if size <= self.cap else None
        took = time.monotonic() - started
        self.last_copy_seconds = took
        self._next_rebuild = self.clock() + max(self.rebuild_gap, self.rebuild_factor * took)
        self._rebuild_due = False
        if copy is None or copy.state() != state:
            self.over_cap = copy is None
            if self.over_cap:
                log.info("reconciliation copy: the set holds %s items, more than --reconcile-copy-max %s; "
                         "answered from the store's aggregates", f"{size:,}", f"{self.cap:,}")
            self._held = None
            self._rebuild_due = not self.over_cap
            return
        self.over_cap = False
        self.copies += 1
        self._held = (copy, state, seq)
        log.info("reconciliation copy: %s items kept in memory (about %.0f MB), copied in %.2f s",
                 f"{size:,}", size * 50 / 1e6, took)
        if self.on_copy is not None:
            self.on_copy()
