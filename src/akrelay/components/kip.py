"""The read-only KIP 2.0 runtime as a component of the relay node.

:class:`Gateway` opens the runtime and its importer and answers a request body;
:class:`KipComponent` starts and stops it and mounts ``POST /v1/kip``
(:mod:`akrelay.http.kip`). Everything a request reads from the installed package
(request schema, grammars, schema packages) is loaded when the gateway is created.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Mapping

from akrelay.kip.budget import DEFAULT_BUDGET_MS
from akrelay.kip.config import KipConfig, space_id_for_origin
from akrelay.kip.errors import KipError
from akrelay.kip.package import AK_PACKAGE_REF
from akrelay.kip.runtime import load_environment, preload
from akrelay.kip.wiring import ReindexSummary, open_runtime, reindex
from akrelay.http import kip as kip_http
from akrelay.http.kip import JSON, KIP_PATH
from akrelay.http.lifecycle import NotRunning
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import parse_strict

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.kip.follower import KipFollower
    from akrelay.kip.runtime import KipRuntime
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings


class Gateway:
    """The relay's KIP runtime and its importer (a :class:`akrelay.kip.follower.KipFollower`).

    With a data directory :meth:`start` opens the runtime in the background (a thread,
    ``akrelay-kip-open``), so the importer starts tailing the log at boot and persists
    next to the store; an in-memory relay's runtime opens in :meth:`start` itself.
    Each request also catches up first, so a client reads the events it had accepted.
    :meth:`stop` stops the importer (the owner calls it before the store closes). A
    request before start or after stop is a 503 (:class:`~akrelay.http.lifecycle.NotRunning`):
    requests never open a runtime of their own (only a first request that finds the
    background opening failed retries it, while the node runs).
    """

    def __init__(self, relay: Relay, *, budget_ms: int | None = DEFAULT_BUDGET_MS, follow: bool = True) -> None:
        self.relay = relay
        self.budget_ms = budget_ms
        self.follow = follow
        self._runtime: KipRuntime | None = None
        self._follower: KipFollower | None = None
        self._lock = threading.Lock()
        self._opener: threading.Thread | None = None
        self._unlisten: Callable[[], None] | None = None
        self._running = False
        self.data_dir = relay.data_dir
        preload()
        self.config = KipConfig.load(self.data_dir, origin=relay.config.origin)
        self.environment = load_environment(self.config)

    def start(self) -> None:
        with self._lock:
            if self._running:
                return
            self._running = True
        if self.data_dir is None:
            self.runtime()  # in memory: nothing to wait for on disk
        elif self._opener is None:
            self._opener = threading.Thread(target=self._open_quietly, name="akrelay-kip-open", daemon=True)
            self._opener.start()

    @property
    def opening(self) -> bool:
        """Whether :meth:`start`'s background open of the runtime is still running (``/readyz``)."""
        opener = self._opener
        return opener is not None and opener.is_alive()

    def _open_quietly(self) -> None:
        try:
            self.runtime()
        except Exception:  # noqa: BLE001 - the first request retries and reports
            pass

    def runtime(self) -> KipRuntime:
        """The running runtime, caught up; :class:`NotRunning` (503) before :meth:`start` or after :meth:`stop`."""
        with self._lock:
            if not self._running:
                raise NotRunning("KIP runtime")
            if self._runtime is None:
                self._runtime, self._follower = open_runtime(
                    self.relay.store, self.data_dir, origin=self.relay.config.origin, config=self.config,
                    environment=self.environment, budget_ms=self.budget_ms, importer=self.follow)
                if self._follower.importer:  # a reader (another process imports) has nothing to wake
                    self._unlisten = self.relay.on_commit(self._follower.notify)
                return self._runtime
            runtime, follower = self._runtime, self._follower
        if follower is not None:  # set together with the runtime
            follower.catch_up(timeout=1.0)
        return runtime

    def read_once(self) -> KipRuntime:
        """A runtime caught up once, with no importer thread (``akrelay kip``/``kql --data``)."""
        with self._lock:
            if self._runtime is None:
                self._runtime, self._follower = open_runtime(
                    self.relay.store, self.data_dir, origin=self.relay.config.origin, config=self.config,
                    environment=self.environment, budget_ms=self.budget_ms, follow=False)
            return self._runtime

    def handle(self, body: bytes, content_type: str | None) -> tuple[int, Mapping[str, object]]:
        runtime = self.runtime()
        media = (content_type or "").partition(";")[0].strip().lower()
        if media != JSON:
            return 400, runtime.failure(None, KipError("InvalidRequestEnvelope", "Content-Type must be application/json"))
        try:
            doc = parse_strict(body, code="invalid_request")
        except ProtocolError as exc:
            return 400, runtime.failure(None, KipError("InvalidRequestEnvelope",
                                                       f"the request body is {exc.message}"))
        return runtime.execute(doc)

    def stop(self) -> None:
        with self._lock:
            self._running = False
        opener, self._opener = self._opener, None
        if opener is not None:
            opener.join(30.0)
        with self._lock:
            if self._unlisten is not None:
                self._unlisten()
                self._unlisten = None
            if self._follower is not None:
                self._follower.stop()
                self._follower = None
                self._runtime = None


class KipComponent:
    """``POST /v1/kip`` and the ``kip`` discovery member, over one :class:`Gateway`."""

    name = "kip"
    options: tuple[str, ...] = ("kip_budget_ms",)

    def __init__(self, relay: Relay, settings: Settings, *, follow: bool = True) -> None:
        self.relay = relay
        self.gateway = Gateway(relay, budget_ms=settings.kip.budget_ms or None, follow=follow)

    def start(self) -> None:
        self.gateway.start()

    def stop(self) -> None:
        self.gateway.stop()

    def opening(self) -> str | None:
        """Why ``/readyz`` waits: the runtime still opens (a KIP request would wait for it)."""
        return "the KIP runtime is opening" if self.gateway.opening else None

    def reindex(self) -> ReindexSummary:
        """Rebuild the on-disk nexus from the whole log (``akrelay reindex --kip``)."""
        if self.gateway.data_dir is None:
            raise RuntimeError("only a relay with a data directory has a KIP nexus file")
        return reindex(self.relay.store, self.gateway.data_dir, origin=self.relay.config.origin)

    def routes(self) -> list[BaseRouteHandler]:
        return kip_http.routes(self.gateway.handle)

    def discovery(self) -> dict[str, object]:
        """The extension member advertising the KIP endpoint (clients ignore unknown members)."""
        origin = self.relay.config.origin
        return {"kip": {
            "protocol": "KIP/2.0",
            "endpoint": origin + KIP_PATH,
            "runtime": "readonly",
            "space_id": space_id_for_origin(origin),
            "languages": ["META", "KQL"],
            "capabilities": {"historical_reads": True, "historical_search": True},
            "schema_packages": [AK_PACKAGE_REF],
            "conformance_level": None,
        }}
