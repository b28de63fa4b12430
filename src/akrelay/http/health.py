"""``GET /healthz`` and ``GET /readyz`` for load balancers and orchestrators.

``/healthz`` says the process answers (no store access: a Redis outage must not
get healthy nodes restarted). ``/readyz`` says this node can serve now: it is
started, no component still opens what its requests read (the KIP runtime opens in
the background after start), and its store answers :meth:`~akrelay.store.base.Store.ping`. The probe
runs on a thread of its own, at most once per :data:`PROBE_INTERVAL`, and a
request waits for a fresh one at most :data:`PROBE_WAIT` seconds, so a flood of
readiness checks costs one ping per second and never blocks the event loop; an
outage shows within about two seconds, a recovery at the next probe. Nothing of a
failure outlives it: a failed answer is kept at most :data:`PROBE_INTERVAL`, and a probe
still running after :data:`PROBE_STUCK` is given up (its thread left to its timeouts) for a
fresh one, so a ping stuck on a dead connection cannot keep a node out of rotation after
Redis is back (issue 24).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from litestar import get
from litestar.response.base import ASGIResponse

from akrelay.http.errors import JSON, error_body
from akrelay.store.base import StoreUnavailable

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.store.base import Store

log = logging.getLogger("akrelay.http")

#: A cached probe result is reused for this many seconds.
PROBE_INTERVAL = 1.0
#: A request waits this long for a fresh probe; a store slower than that is not ready.
PROBE_WAIT = 1.5
#: A probe running this long is given up for a fresh one on a new thread.
PROBE_STUCK = 5.0

_OK = b'{"status":"ok"}'


class Readiness:
    """The cached answer of ``/readyz``: is the node started, and did the store answer lately?"""

    def __init__(self, store: Store, started: Callable[[], bool],
                 opening: Callable[[], str | None] = lambda: None) -> None:
        self.store = store
        self.started = started
        #: What a started node still opens in the background (the KIP runtime), or ``None``
        self.opening = opening
        self._checked = float("-inf")
        self._problem: str | None = None
        self._probe: asyncio.Future[None] | None = None
        self._probe_started = 0.0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="akrelay-readyz")

    def _ping(self) -> str | None:
        try:
            self.store.ping()
        except StoreUnavailable as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure to answer means "not ready", reported in the body
            return f"the store failed to answer: {exc}"
        return None

    async def check(self) -> str | None:
        """``None`` when ready, else why not (probing when the cached answer is stale)."""
        if not self.started():
            return "the relay node is starting or stopping"
        opening = self.opening()
        if opening is not None:  # a request would wait for it: not ready yet (issue 25)
            return opening
        if time.monotonic() - self._checked < PROBE_INTERVAL:
            return self._problem
        loop = asyncio.get_running_loop()
        if self._probe is not None and time.monotonic() - self._probe_started > PROBE_STUCK:
            log.warning("readiness probe stuck for over %.0f s; starting a fresh one", PROBE_STUCK)
            stuck, self._pool = self._pool, ThreadPoolExecutor(1, thread_name_prefix="akrelay-readyz")
            stuck.shutdown(wait=False)
            self._probe = None
        if self._probe is None:
            self._probe_started = time.monotonic()
            self._probe = asyncio.ensure_future(self._refresh(loop, self._pool))
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), PROBE_WAIT)
        except asyncio.TimeoutError:
            return f"the store did not answer within {PROBE_WAIT} s"
        return self._problem

    async def _refresh(self, loop: asyncio.AbstractEventLoop, pool: ThreadPoolExecutor) -> None:
        me = asyncio.current_task()
        try:
            problem = await loop.run_in_executor(pool, self._ping)
            if self._probe is not me:  # given up as stuck: a newer probe decides
                return
            if problem != self._problem:
                if problem is None:
                    log.info("ready: the store answers again")
                else:
                    log.warning("not ready: %s", problem)
            self._problem = problem
            self._checked = time.monotonic()
        finally:
            if self._probe is me:
                self._probe = None

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def health_routes(readiness: Readiness) -> list[BaseRouteHandler]:
    """``/healthz`` (the process answers) and ``/readyz`` (started, and the store answers); HEAD too."""

    @get("/healthz", sync_to_thread=False, opt={"rate": "none"})
    def healthz() -> ASGIResponse:
        return ASGIResponse(body=_OK, status_code=200, media_type=JSON)

    @get("/readyz", opt={"rate": "none"})
    async def readyz() -> ASGIResponse:
        problem = await readiness.check()
        if problem is None:
            return ASGIResponse(body=_OK, status_code=200, media_type=JSON)
        return ASGIResponse(body=error_body("service_unavailable", f"Not ready: {problem}."), status_code=503,
                            media_type=JSON, headers={"Retry-After": "1"})

    return [healthz, readyz]
