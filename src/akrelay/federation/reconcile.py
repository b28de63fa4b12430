"""Set reconciliation between relays (issue 26): the responder behind the endpoint, and sync's initiator.

Why: a relay that only pulls ``after_seq`` fetches every event once per peer and never asks
again for one it skipped. Reconciling the two sets of fetchable records (negentropy V1 over
``(created_at, event hash)``, :mod:`akrelay.protocol.reconcile`) finds exactly the events the
peer has and we lack, in a few round trips whose size grows with the differences.

* :func:`respond` answers one message over the store's reconciliation view
  (:mod:`akrelay.store.recon`) within a read budget; it keeps nothing between rounds.
* :func:`reconcile_peer` runs the initiator against a peer's endpoint, then fetches what
  it learned (``need``) through the peer's batch read and hands the envelopes to the sync
  engine's own ingestion (:meth:`SyncEngine._ingest_page`): verified exactly like pulled
  events, parked when a dependency is missing. What the peer claims is only a list of ids:
  a forged fingerprint costs a few rounds, never an unverified acceptance.

What bounds a session with a hostile peer: :data:`~akrelay.protocol.reconcile.MAX_ROUNDS`
rounds, every answer at most :data:`~akrelay.protocol.reconcile.MAX_MESSAGE` bytes and the
peer's ``read_timeout``, the whole session :data:`SESSION_SECONDS`, and at most
:data:`MAX_NEED` ids learned (32 bytes each) before they are fetched.
"""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.reconcile import DEFAULT_FRAME_LIMIT, MAX_MESSAGE, MAX_ROUNDS, Reconciler
from akrelay.store.base import StoreUnavailable
from akrelay.store.recon import DEFAULT_BUDGET, ReconIndex, StoreView, ViewChanged

if TYPE_CHECKING:  # annotations only
    from akrelay.federation.peers import Peer
    from akrelay.federation.state import PeerState
    from akrelay.federation.transport import PeerTransport
    from akrelay.relay.core import Relay

log = logging.getLogger("akrelay.federation.reconcile")


class PassResult(Protocol):
    """What a reconciliation adds to the pass it runs in (:class:`akrelay.federation.sync.PassResult`)."""

    accepted: int


class SyncEngine(Protocol):
    """What a reconciliation uses of :class:`akrelay.federation.sync.SyncEngine`, which calls it (named
    here, not imported, so that the two modules form no cycle)."""

    relay: Relay
    options: Any

    def now_ms(self) -> int: ...

    def fetch_and_ingest(self, peer: Peer, transport: PeerTransport, batch_url: str, ids: list[str],
                         st: PeerState, result: Any) -> tuple[int, int]: ...

RECONCILE_PATH = "/v1/knowledge/reconcile"
MEDIA_TYPE = "application/octet-stream"
#: What the discovery document says of the endpoint (``reconcile.protocol``).
PROTOCOL_NAME = "negentropy-v1"
#: Longest one reconciliation with a peer may take, all rounds together (seconds).
SESSION_SECONDS = 120.0
#: Most ids one session learns before it stops and fetches them (a forged "need" list costs this much).
MAX_NEED = 100_000
#: The largest ``created_at`` a filter bound may name (the envelope's range, 2^53 - 1).
MAX_CREATED_AT = 2**53 - 1
#: Why a peer is pulled only ``after_seq``: shown by ``akrelay peers status``.
#: Ids per batch read (the §9.4 limit, as sync's ``BATCH_MAX_IDS``).
BATCH_IDS = 100
#: The session clock (a module attribute so that tests can make rounds "slow" without sleeping).
_monotonic = time.monotonic
NOT_ADVERTISED = "the peer does not advertise reconcile: after_seq pulls only (holes are not healed)"


def index_of(store: Any) -> ReconIndex | None:
    """The store's reconciliation index, or ``None`` for a backend that keeps none."""
    return getattr(store, "recon", None)


def parse_window(pairs: Iterable[tuple[str, str]]) -> tuple[int | None, int | None]:
    """The ``since`` / ``until`` filter (``since <= created_at < until``, ms) of a request's query string."""
    found: dict[str, int] = {}
    for name, value in pairs:
        if name not in ("since", "until"):
            raise ProtocolError("invalid_request", f"unknown parameter {name!r} (reconcile takes since and until)")
        if name in found:
            raise ProtocolError("invalid_request", f"{name} is given twice")
        if not value.isdigit() or len(value) > 16 or int(value) > MAX_CREATED_AT:
            raise ProtocolError("invalid_request", f"{name} must be an integer from 0 through {MAX_CREATED_AT}")
        found[name] = int(value)
    since, until = found.get("since"), found.get("until")
    if since is not None and until is not None and until <= since:
        raise ProtocolError("invalid_request", "until must be greater than since")
    return since, until


def respond(index: ReconIndex, message: bytes, *, since: int | None = None, until: int | None = None,
            budget: int | None = None) -> bytes:
    """The answer to one initiator message, read from one snapshot of the index within ``budget`` rows."""
    budget = DEFAULT_BUDGET if budget is None else budget
    if len(message) > MAX_MESSAGE:
        raise ProtocolError("invalid_request", f"reconciliation message: {len(message)} bytes (at most {MAX_MESSAGE})")
    with index.recon_snapshot():
        try:
            return Reconciler(StoreView(index, budget=budget, since=since, until=until)).respond(message)
        except ViewChanged as exc:
            raise StoreUnavailable(f"the reconciliation index changed while it was read ({exc}); retry", 1) from None


def discovery(origin: str) -> dict[str, Any]:
    """The members the endpoint adds to the §9.2 document."""
    return {"reconcile": {"endpoint": origin.rstrip("/") + RECONCILE_PATH, "protocol": PROTOCOL_NAME,
                          "items": "created_at,hash", "frame_limit": DEFAULT_FRAME_LIMIT, "max_message": MAX_MESSAGE}}


def advertised_endpoint(doc: Any, origin: str) -> str | None:
    """The reconcile endpoint a peer's discovery document advertises on its own origin, else ``None``."""
    member = doc.get("reconcile") if isinstance(doc, dict) else None
    if not isinstance(member, dict) or member.get("protocol") != PROTOCOL_NAME:
        return None
    url = member.get("endpoint")
    if not isinstance(url, str) or not url.startswith(origin + "/") or len(url) > 2048 or "?" in url or "#" in url:
        return None
    return url


# ---- the initiator ---------------------------------------------------------------------------

@dataclass(slots=True)
class ReconcileResult:
    """What one reconciliation with one peer did (``akrelay sync --reconcile`` prints it)."""

    origin: str
    supported: bool = True
    complete: bool = False
    error: str | None = None
    rounds: int = 0
    sent: int = 0
    received: int = 0
    have: int = 0
    need: int = 0
    batches: int = 0
    absent: int = 0
    #: of the fetched events, how many were new here (the rest were duplicates, rejected or parked)
    accepted: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        if not self.supported:
            return NOT_ADVERTISED
        text = (f"{'reconciled' if self.complete else 'incomplete'}: have {self.have}, need {self.need}, "
                f"{self.rounds} round(s), {self.sent + self.received:,} bytes, {self.batches} batch fetch(es), "
                f"accepted {self.accepted}")
        if self.absent:
            text += f", {self.absent} not served by the peer"
        return text + (f"; {self.error}" if self.error else "")


def event_id_of(raw: bytes) -> str:
    """The ``hash`` (base64url, unpadded) of a 32-byte id."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def learn(transport: PeerTransport, url: str, index: ReconIndex, result: ReconcileResult, *,
          since: int | None = None, until: int | None = None, max_need: int | None = None,
          deadline: float | None = None, monotonic: Callable[[], float] | None = None,
          progress: Callable[[ReconcileResult], None] | None = None) -> list[bytes]:
    """Run the initiator against ``url``: the ids the peer has and we lack (``result`` counts the rest).

    Each of our steps reads one snapshot of our own index, held only while computing
    (never across a round trip). Raises ``ProtocolError`` for a malformed answer or too
    many rounds, ``PeerFetchError`` for a failed request; stops early (``complete`` stays
    false) at the session deadline or once ``max_need`` ids are known.
    """
    from akrelay.federation.transport import PeerFetchError

    monotonic = monotonic or _monotonic
    deadline = SESSION_SECONDS if deadline is None else deadline
    max_need = MAX_NEED if max_need is None else max_need
    started = monotonic()
    query = ("?" + "&".join(f"{k}={v}" for k, v in (("since", since), ("until", until)) if v is not None)
             if since is not None or until is not None else "")
    with index.recon_snapshot():
        reconciler = Reconciler(StoreView(index, since=since, until=until), max_rounds=MAX_ROUNDS)
        message: bytes | None = reconciler.initiate()
    need: list[bytes] = []
    while message is not None:
        if monotonic() - started > deadline:
            result.error = f"stopped after {deadline:.0f} s ({result.rounds} rounds)"
            return need
        result.sent += len(message)
        try:
            reply = transport.post_bytes(url + query, message, content_type=MEDIA_TYPE, max_bytes=MAX_MESSAGE)
        except PeerFetchError as exc:
            if exc.kind == "too_large":
                raise ProtocolError("invalid_request", f"reconciliation answer over {MAX_MESSAGE} bytes") from None
            raise
        result.received += len(reply)
        result.rounds += 1
        with index.recon_snapshot():
            reconciler.storage = StoreView(index, since=since, until=until)
            outcome = reconciler.reconcile(reply)
        result.have += len(outcome.have)
        need.extend(outcome.need)
        result.need = len(need)
        if progress is not None:
            progress(result)
        if len(need) >= max_need:
            result.error = f"stopped after learning {len(need)} missing events (at most {max_need} per session)"
            return need
        message = outcome.message
    result.complete = True
    return need


def reconcile_peer(engine: SyncEngine, peer: Peer, transport: PeerTransport, url: str, batch_url: str,
                   st: PeerState, pass_result: PassResult, *, since: int | None = None, until: int | None = None,
                   progress: Callable[[ReconcileResult], None] | None = None) -> ReconcileResult:
    """Reconcile with ``peer`` and ingest what it has that we lack, through the engine's own path."""
    index = index_of(engine.relay.store)
    result = ReconcileResult(peer.origin)
    if index is None:
        result.supported = False
        result.error = "this relay's store keeps no reconciliation index"
        return result
    started = time.monotonic()
    accepted_before = pass_result.accepted
    need = learn(transport, url, index, result, since=since, until=until, progress=progress)
    for start in range(0, len(need), BATCH_IDS):
        ids = [event_id_of(i) for i in need[start:start + BATCH_IDS]]
        result.batches += 1
        _, absent = engine.fetch_and_ingest(peer, transport, batch_url, ids, st, pass_result)
        result.absent += absent
        result.accepted = pass_result.accepted - accepted_before
        if progress is not None:
            progress(result)
    result.seconds = time.monotonic() - started
    return result


def _bootstrap_checkpoint(transport: PeerTransport, query_url: str) -> int:
    """The peer's checkpoint now (one page of one record): what a complete reconciliation covers."""
    from akrelay.federation.transport import PeerFetchError

    page = transport.get_json(query_url, {"after_seq": "0", "limit": "1"})
    checkpoint = page.get("checkpoint") if isinstance(page, dict) else None
    if type(checkpoint) is not int or checkpoint < 0:
        raise PeerFetchError("invalid", f"{query_url}: query page without a valid checkpoint: {checkpoint!r}")
    return checkpoint


def maybe_reconcile(engine: SyncEngine, peer: Peer, transport: PeerTransport, endpoints: dict[str, str],
                    st: PeerState, pass_result: PassResult, *, force: bool = False,
                    progress: Callable[[ReconcileResult], None] | None = None) -> ReconcileResult | None:
    """Reconcile inside a pass when it is due: on first contact (bootstrap), every ``reconcile_interval``, or ``force``.

    On first contact a complete reconciliation moves our checkpoint for the peer to the
    checkpoint it had before the rounds began, so the pull that follows does not fetch
    again what we already hold from elsewhere (not for a peer with a pinned ``log_key``,
    whose signed log each pass verifies from our checkpoint on). A failed reconciliation
    never fails the pass: it is noted, and the ``after_seq`` pull goes on as before.
    """
    from akrelay.federation.transport import PeerFetchError

    url = endpoints.get("reconcile")
    if url is None:
        st.reconcile_note = NOT_ADVERTISED
        return ReconcileResult(peer.origin, supported=False) if force else None
    index = index_of(engine.relay.store)
    if index is None:
        st.reconcile_note = "this relay's store keeps no reconciliation index: after_seq pulls only"
        return None
    now = engine.now_ms()
    first = st.last_reconcile is None and st.checkpoint == 0 and st.resume_seq == 0
    interval = engine.options.reconcile_interval
    due = force or first or (interval > 0 and now - (st.last_reconcile or 0) >= interval * 1000)
    if not due:
        return None
    with index.recon_snapshot():
        empty = StoreView(index).size() == 0
    if first and empty and not force:
        st.last_reconcile = now  # nothing to spare: the pull fetches everything once anyway
        st.reconcile_note = "first contact with an empty store: pulled after_seq"
        return None
    bootstrap_at = _bootstrap_checkpoint(transport, endpoints["query"]) if first and not peer.log_key else None
    try:
        result = reconcile_peer(engine, peer, transport, url, endpoints["batch"], st, pass_result, progress=progress)
    except (PeerFetchError, ProtocolError, ViewChanged) as exc:
        message = str(exc) if not isinstance(exc, ProtocolError) else f"{exc.code}: {exc.message}"
        st.last_reconcile = now
        st.reconcile_note = f"reconcile failed ({message[:300]}); pulled after_seq"
        log.warning("sync %s: reconcile failed: %s; pulling after_seq", peer.origin, message)
        return ReconcileResult(peer.origin, error=message)
    st.last_reconcile = now
    st.reconcile_note = result.summary()
    if result.complete and bootstrap_at is not None and st.checkpoint == 0 and st.resume_seq == 0:
        st.checkpoint = bootstrap_at
        st.peer_checkpoint = max(st.peer_checkpoint, bootstrap_at)
        st.reconcile_note += f"; bootstrapped: pulling after seq {bootstrap_at}"
    log.info("sync %s: %s", peer.origin, st.reconcile_note)
    return result
