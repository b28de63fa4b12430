"""Federation as a component of the relay node: peer hints in discovery, the push stream, reconciliation and the sync loop.

Discovery gains the configured peer origins as hints (§9.2), and each worker
offers to run the sync loop, of which exactly one per data directory leads
(:mod:`akrelay.federation.runner`); without ``--peers`` there is no loop. Two
endpoints are served either way: the push stream that peers subscribe to
(:mod:`akrelay.http.stream`, unless ``--no-push-stream``) and set reconciliation,
``POST /v1/knowledge/reconcile`` (:mod:`akrelay.http.reconcile`, unless ``--no-reconcile``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from akrelay.federation.peers import canonical_https_origin, distinct_origins, load_peers
from akrelay.http.stream import PushStream
from akrelay.settings import SettingsError

if TYPE_CHECKING:  # annotations only; the sync loop (HTTP client, schemas) loads when it runs (issue 25)
    from litestar.handlers import BaseRouteHandler
    from akrelay.federation.leadership import Leadership
    from akrelay.federation.runner import BackgroundSync
    from akrelay.federation.sync import PassResult
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings
    from akrelay.store.recon_copy import KeptCopy


def _count_copy() -> None:
    from akrelay.observability.metrics import metrics

    metrics().reconcile_copies.inc()


class SyncComponent:
    """The sync loop over the node's own relay (no second relay on the same data directory)."""

    name = "sync"
    options: tuple[str, ...] = ("peers", "follow_hints", "hint_hops", "hint_count", "reconcile_copy_max")

    def __init__(self, relay: Relay, settings: Settings, *, leadership: Callable[[], Leadership]) -> None:
        """``leadership``: the node backend's election (a data directory's flock, a deployment's lease)."""
        self.relay = relay
        self.settings = settings
        self.leadership = leadership
        self._loop: BackgroundSync | None = None
        self.push = PushStream(relay, settings)
        #: this process's copy of the reconciliation set, kept current once started (none: not kept)
        self.kept: KeptCopy | None = None
        from akrelay.federation.reconcile import index_of

        index = index_of(relay.store)
        if index is not None and not settings.federation.no_reconcile and settings.federation.reconcile_copy_max > 0:
            from akrelay.store.recon_copy import KeptCopy

            self.kept = KeptCopy(relay.store, index, cap=settings.federation.reconcile_copy_max,
                                 on_copy=_count_copy)

    @staticmethod
    def check(settings: Settings) -> None:
        """Refuse an unreadable or invalid peer file before anything starts (:func:`akrelay.node.check_components`)."""
        if settings.federation.peers:
            try:
                load_peers(settings.federation.peers)
            except ValueError as exc:  # PeerConfigError: its message names the file and the entry
                raise SettingsError(f"--peers {settings.federation.peers!r}: {exc}") from None

    @property
    def enabled(self) -> bool:
        return bool(self.settings.federation.peers)

    def start(self) -> None:
        """The kept copy's keeper (it copies the set at once), then the sync loop if there are peers."""
        if self.kept is not None:
            self.kept.start()
        if self.enabled and self._loop is None:
            from akrelay.federation.runner import BackgroundSync

            self._loop = BackgroundSync(self.settings, self.relay, self.leadership(), kept=self.kept)
            self._loop.start()

    def stop(self) -> None:
        self.push.stop()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()
        if self.kept is not None:
            self.kept.stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Block while the loop runs (``akrelay sync`` in the foreground); whether it still runs."""
        loop = self._loop
        if loop is None:
            return False
        loop.join(timeout)
        return loop.is_alive()

    def run_once(self, *, force: bool = True) -> list[PassResult]:
        """One pass over every peer (``akrelay sync --once``), as the data directory's leader."""
        from akrelay.federation.runner import sync_once

        return sync_once(self.settings, self.relay, self.leadership(), force=force)

    def skipped_self(self) -> list[str]:
        """Enabled peers on this relay's own origin: sync never takes one (a shared mesh file lists us too)."""
        if not self.enabled:
            return []
        try:
            own = canonical_https_origin(self.relay.config.origin)
        except ValueError:
            return []
        return [p.origin for p in load_peers(self.settings.federation.peers).peers if p.enabled and p.origin == own]

    def routes(self) -> list[BaseRouteHandler]:
        """The push stream and ``POST /v1/knowledge/reconcile`` (issue 26), served with or without peers."""
        from akrelay.http import reconcile

        return self.push.routes() + reconcile.routes(self.relay, self.settings, kept=self.kept)

    def discovery(self) -> dict[str, object]:
        """The push stream, the reconcile endpoint, and up to 32 enabled peer origins (canonical, distinct,
        never our own)."""
        from akrelay.federation.reconcile import discovery
        from akrelay.http import reconcile

        doc = self.push.discovery()
        if reconcile.enabled(self.relay, self.settings):
            doc = doc | discovery(self.relay.config.origin,
                                  accepts_offers=not self.settings.federation.no_accept_offers)
        if not self.enabled:
            return doc
        return doc | {"peers": distinct_origins(load_peers(self.settings.federation.peers).peers, self.relay.config.origin)}
