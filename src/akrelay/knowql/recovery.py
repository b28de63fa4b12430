"""No turn stays ``in_progress`` (its session busy, 409) because its process died or Redis went away.

* Every turn records its owner (host, pid, and a token of the process's start). When a
  worker opens the turn store it fails the turns of this host whose owner no longer runs,
  or that carry its own pid with another start token (a restart reused the pid).
* A terminal write the store refuses during an outage (:class:`StoreUnavailable`) is kept
  by :class:`Deferred` and written once the store answers again: the turn is finished (or
  failed) then instead of at its deadline. The outage is logged once, without a traceback,
  and its end once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

from akrelay.knowql.documents import Owner, QueryDoc
from akrelay.store.base import StoreUnavailable

if TYPE_CHECKING:  # annotations only
    from akrelay.knowql.store import TurnStore

log = logging.getLogger("akrelay.knowql")

#: Most deferred writes kept (one per turn); past it the oldest is dropped (its deadline fails it).
MAX_DEFERRED = 4096
#: Seconds between attempts while the store is away (doubling up to the max).
RETRY_FIRST = 0.5
RETRY_MAX = 8.0
#: Most orphans looked at when a worker opens the store.
MAX_ORPHANS = 10_000
ORPHAN_MESSAGE = "the relay process running the turn stopped before the turn ended"

_boot: tuple[int, str] | None = None


def owner() -> Owner:
    """This process as a turn's owner (the token is per pid, so a forked worker gets its own)."""
    global _boot
    pid = os.getpid()
    if _boot is None or _boot[0] != pid:
        _boot = (pid, uuid.uuid4().hex)
    return {"host": socket.gethostname(), "pid": pid, "boot": _boot[1]}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def is_orphan(doc: QueryDoc, me: Owner) -> bool:
    """True when ``doc``'s owner was a process of this host that no longer runs."""
    mine = doc.get("_owner")
    if not isinstance(mine, dict) or mine.get("host") != me["host"]:
        return False  # another host's (or an older version's) turn: its deadline still bounds it
    if mine.get("pid") == me["pid"]:
        rebooted: bool = mine.get("boot") != me["boot"]
        return rebooted
    return not _alive(mine.get("pid"))


def fail_orphans(store: TurnStore) -> int:
    """Fail this host's turns whose process is gone; how many were failed."""
    me = owner()
    failed = 0
    for doc in store.in_progress(MAX_ORPHANS):
        if is_orphan(doc, me) and store.finish(doc["id"], "failed", {"error": ORPHAN_MESSAGE},
                                               {"type": "response.failed", "error": ORPHAN_MESSAGE}):
            failed += 1
    if failed:
        log.warning("KnowQL: failed %d turn(s) left in progress by a process that no longer runs", failed)
    return failed


class Deferred:
    """Store writes refused during an outage, retried on a thread of their own until the store answers."""

    def __init__(self) -> None:
        self._writes: OrderedDict[str, Callable[[], object]] = OrderedDict()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage = False

    def __len__(self) -> int:
        return len(self._writes)

    def add(self, key: str, write: Callable[[], object], exc: BaseException) -> None:
        """Keep ``write`` (it raised ``exc``, a :class:`StoreUnavailable`) to run once the store is back."""
        with self._lock:
            self._writes[key] = write
            self._writes.move_to_end(key)
            while len(self._writes) > MAX_DEFERRED:
                self._writes.popitem(last=False)
            first, self._outage = not self._outage, True
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name="akrelay-knowql-deferred", daemon=True)
                self._thread.start()
        if first:
            log.warning("KnowQL: the turn store is unreachable (%s); interrupted turns will be finished once it "
                        "is back", exc)
        self._wake.set()

    def flush(self) -> bool:
        """Try every kept write once, oldest first; True when none is left."""
        while True:
            with self._lock:
                if not self._writes:
                    outage, self._outage = self._outage, False
                    break
                key, write = next(iter(self._writes.items()))
            try:
                write()
            except StoreUnavailable:
                return False
            except Exception:  # a bug in one write must not keep the others waiting
                log.exception("KnowQL: a deferred write of %s failed", key)
            with self._lock:
                if self._writes.get(key) is write:
                    del self._writes[key]
        if outage:
            log.warning("KnowQL: the turn store is back; interrupted turns were finished")
        return True

    def _run(self) -> None:
        delay = RETRY_FIRST
        while not self._stopped.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stopped.is_set():
                return
            if self.flush():
                delay = RETRY_FIRST
                self._wake.wait()  # idle until the next deferral
            else:
                delay = min(RETRY_MAX, delay * 2)

    def close(self) -> None:
        """One last attempt, then stop the thread (what is still kept fails at its deadline)."""
        self.flush()
        self._stopped.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)
