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
* :func:`offer` then submits what we hold and the peer lacks (``have``) to a peer whose
  discovery says ``reconcile.accepts_offers``: one ordinary ``POST`` of each envelope to its
  ``events`` endpoint (events are self-verifying, so the peer checks them like any client
  submission), bounded per pass, in our ``seq`` order (dependencies first), stopped by a
  429/503 or an outage, and never offering again an event the peer refused.
* :func:`parse_filter` / :func:`filtered_items`: the ``since`` / ``until`` window is answered from
  the precomputed aggregates; a ``type`` filter has none, so its set is read through the
  store's term index into memory, at most :data:`MAX_FILTERED` events per message.

What bounds a session with a hostile peer: :data:`~akrelay.protocol.reconcile.MAX_ROUNDS`
rounds, every answer at most :data:`~akrelay.protocol.reconcile.MAX_MESSAGE` bytes and the
peer's ``read_timeout``, the whole session :data:`SESSION_SECONDS`, and at most
:data:`MAX_NEED` ids learned (32 bytes each) before they are fetched.
"""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from akrelay.jsontypes import JSONObject

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import EVENT_TYPES
from akrelay.protocol.reconcile import (DEFAULT_FRAME_LIMIT, MAX_MESSAGE, MAX_ROUNDS, MIN_FRAME_LIMIT, Reconciler,
                                        SortedItems, Storage)
from akrelay.store.base import StoreUnavailable
from akrelay.store.recon import (DEFAULT_BUDGET, SNAPSHOT_CAP, OwnSet, ReconIndex, ResponderCopy, StoreView,
                                 ViewChanged)
from akrelay.store.capabilities import Reconcilable

if TYPE_CHECKING:  # annotations only
    from akrelay.federation.peers import Peer
    from akrelay.federation.state import PeerState
    from akrelay.federation.transport import PeerTransport
    from akrelay.relay.core import Relay
    from akrelay.store.base import Store
    from akrelay.store.recon_copy import KeptCopy

log = logging.getLogger("akrelay.federation.reconcile")


class PassResult(Protocol):
    """What a reconciliation adds to the pass it runs in (:class:`akrelay.federation.sync.PassResult`)."""

    accepted: int


class ReconcileOptions(Protocol):
    """What a reconciliation reads of :class:`akrelay.federation.sync.SyncOptions`."""

    @property
    def offer(self) -> bool: ...

    @property
    def offer_max(self) -> int: ...

    @property
    def reconcile_interval(self) -> float: ...


class SyncEngine(Protocol):
    """What a reconciliation uses of :class:`akrelay.federation.sync.SyncEngine`, which calls it (named
    here, not imported, so that the two modules form no cycle)."""

    relay: Relay
    @property
    def options(self) -> ReconcileOptions: ...

    def now_ms(self) -> int: ...

    def fetch_and_ingest(self, peer: Peer, transport: PeerTransport, batch_url: str, ids: list[str],
                         st: PeerState, result: Any) -> tuple[int, int]: ...  # Any: sync's PassResult; a Protocol would not match

    #: origin -> what the peer's discovery says of reconciliation (set by discovery, :func:`capabilities`)
    reconcile_caps: dict[str, Capabilities]
    #: the process's kept copy of our set, when its node keeps one (:mod:`akrelay.store.recon_copy`)
    kept_copy: KeptCopy | None

RECONCILE_PATH = "/v1/knowledge/reconcile"
MEDIA_TYPE = "application/octet-stream"
#: What the discovery document says of the endpoint (``reconcile.protocol``).
PROTOCOL_NAME = "negentropy-v1"
#: Longest one reconciliation with a peer may take, all rounds together (seconds).
SESSION_SECONDS = 120.0
#: Seconds an initiator waits for the kept copy of its set to catch up before its first round.
KEPT_WAIT = 10.0
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


def index_of(store: object) -> ReconIndex | None:
    """The store's reconciliation index, or ``None`` for a backend that keeps none."""
    return store.recon if isinstance(store, Reconcilable) else None


@dataclass(frozen=True, slots=True)
class Filter:
    """What narrows both sides' sets: ``since <= created_at < until`` (ms) and the event ``types``.

    ``types`` is ``None`` (every type) or a sorted, distinct tuple of §5 event types.
    """

    since: int | None = None
    until: int | None = None
    types: tuple[str, ...] | None = None

    def query(self) -> str:
        """The filter as the endpoint's query string (``""`` for none), in one canonical form."""
        parts = [f"{k}={v}" for k, v in (("since", self.since), ("until", self.until)) if v is not None]
        if self.types is not None:
            parts.append("type=" + ",".join(self.types))
        return "?" + "&".join(parts) if parts else ""

    def describe(self) -> str:
        parts = []
        if self.since is not None:
            parts.append(f"created_at >= {self.since}")
        if self.until is not None:
            parts.append(f"created_at < {self.until}")
        if self.types is not None:
            parts.append("type " + "|".join(self.types))
        return ", ".join(parts)


NO_FILTER = Filter()
#: Most events a ``type``-filtered set may hold (one message reads them all: there is no
#: precomputed aggregate per type); past it the answer is 400, "narrow since/until".
MAX_FILTERED = 20_000
#: Longest ``type`` value: every event type once, with commas.
_MAX_TYPES_TEXT = sum(len(t) + 1 for t in EVENT_TYPES)


def parse_types(value: str) -> tuple[str, ...]:
    """``knowledge.publish,knowledge.assess``: distinct §5 event types, sorted; ``invalid_request`` otherwise."""
    if not value or len(value) > _MAX_TYPES_TEXT:
        raise ProtocolError("invalid_request", "type must list event types, separated by commas: "
                            + ", ".join(sorted(EVENT_TYPES)))
    names = value.split(",")
    for name in names:
        if name not in EVENT_TYPES:
            raise ProtocolError("invalid_request", f"type: {name[:40]!r} is not an event type "
                                f"({', '.join(sorted(EVENT_TYPES))})")
    if len(set(names)) != len(names):
        raise ProtocolError("invalid_request", "type: an event type is listed twice")
    return tuple(sorted(names))


def parse_frame_limit(value: str) -> int:
    """``frame_limit``: the most bytes the initiator takes in one answer, from negentropy's least to our largest."""
    if not value.isdigit() or not value.isascii() or len(value) > 7 or not MIN_FRAME_LIMIT <= int(value) <= MAX_MESSAGE:
        raise ProtocolError("invalid_request", f"frame_limit must be an integer from {MIN_FRAME_LIMIT} through "
                            f"{MAX_MESSAGE} (bytes of one answer)")
    return int(value)


def parse_request(pairs: Iterable[tuple[str, str]]) -> tuple[Filter, int]:
    """The endpoint's query string: the :func:`parse_filter` window, and the answer's ``frame_limit``
    (default :data:`DEFAULT_FRAME_LIMIT`, what a negentropy initiator expects)."""
    rest: list[tuple[str, str]] = []
    limit: int | None = None
    for name, value in pairs:
        if name != "frame_limit":
            rest.append((name, value))
        elif limit is not None:
            raise ProtocolError("invalid_request", "frame_limit is given twice")
        else:
            limit = parse_frame_limit(value)
    return parse_filter(rest), DEFAULT_FRAME_LIMIT if limit is None else limit


def parse_filter(pairs: Iterable[tuple[str, str]]) -> Filter:
    """The filter of a request's query string: ``since``, ``until`` (ms) and ``type``; strict."""
    seen: set[str] = set()
    bounds: dict[str, int] = {}
    types: tuple[str, ...] | None = None
    for name, value in pairs:
        if name not in ("since", "until", "type"):
            raise ProtocolError("invalid_request", f"unknown parameter {name[:40]!r} (reconcile takes since, "
                                "until, type and frame_limit)")
        if name in seen:
            raise ProtocolError("invalid_request", f"{name} is given twice")
        seen.add(name)
        if name == "type":
            types = parse_types(value)
            continue
        if not value.isdigit() or not value.isascii() or len(value) > 16 or int(value) > MAX_CREATED_AT:
            raise ProtocolError("invalid_request", f"{name} must be an integer from 0 through {MAX_CREATED_AT}")
        bounds[name] = int(value)
    since, until = bounds.get("since"), bounds.get("until")
    if since is not None and until is not None and until <= since:
        raise ProtocolError("invalid_request", "until must be greater than since")
    # every type is no type filter: the whole set, answered from the aggregates
    return Filter(since, until, None if types is not None and set(types) == EVENT_TYPES else types)


def filtered_items(store: Store, window: Filter, *, limit: int | None = None) -> SortedItems:
    """The fetchable events of ``window.types`` in the window, through the store's term index, in memory.

    Reads at most ``limit + 1`` records in all (default :data:`MAX_FILTERED`): a larger set is
    ``invalid_request``, so that a small message never costs an unbounded scan. Not inside
    ``recon_snapshot()``: it reads the store, which takes its own transaction or locks.
    """
    from akrelay.store.base import event_hash_bytes

    assert window.types is not None
    limit = MAX_FILTERED if limit is None else limit
    items: list[tuple[int, bytes]] = []
    for etype in window.types:
        after = 0
        while True:
            page = store.query([("type", etype)], window.since, window.until, after_seq=after,
                               limit=min(1000, limit + 1 - len(items)))
            for record in page:
                items.append((record.envelope.event["created_at"], event_hash_bytes(record.id)))
            if len(items) > limit:
                raise ProtocolError("invalid_request",
                                    f"reconcile: the type filter's set holds more than {limit:,} events (it has "
                                    "no precomputed fingerprints and is read per message); narrow since/until")
            if not page:
                break
            after = page[-1].seq
    return SortedItems(items)


def respond(index: ReconIndex, message: bytes, *, since: int | None = None, until: int | None = None,
            budget: int | None = None, types: tuple[str, ...] | None = None, store: Store | None = None,
            frame_limit: int = DEFAULT_FRAME_LIMIT, copies: ResponderCopy | None = None,
            kept: KeptCopy | None = None, answered: Callable[[str], None] | None = None) -> bytes:
    """The answer to one initiator message, read from one snapshot of the index within ``budget`` rows.

    With ``types`` the set is read from ``store`` (:func:`filtered_items`, bounded by :data:`MAX_FILTERED`).
    With ``copies`` (one per process, shared by every message), the whole set is answered from a
    copy in memory once large reconciliations have read enough (:class:`akrelay.store.recon.ResponderCopy`).
    With ``kept`` running (the process's :class:`~akrelay.store.recon_copy.KeptCopy`), the whole set
    is answered from it whenever it is current; ``copies`` then serves only while it holds no copy at
    all (past its cap, still copying), since one that is behind is being caught up.
    ``answered`` is told what answered: ``"copy"`` (memory) or ``"store"`` (the aggregates).
    """
    budget = DEFAULT_BUDGET if budget is None else budget
    if len(message) > MAX_MESSAGE:
        raise ProtocolError("invalid_request", f"reconciliation message: {len(message)} bytes (at most {MAX_MESSAGE})")
    if types is not None:
        if store is None:
            raise ProtocolError("invalid_request", "this relay cannot filter reconciliation by type")
        return Reconciler(filtered_items(store, Filter(since, until, types)), frame_limit=frame_limit).respond(message)
    with index.recon_snapshot():
        try:
            view = StoreView(index, budget=budget, since=since, until=until)
            whole = since is None and until is None
            storage: Storage = view
            if whole and kept is not None and kept.running:
                current = kept.current(view)
                if current is not None:
                    storage = current
                elif not kept.holds and copies is not None:
                    # no kept copy (past its cap, still copying, failed): the responder's copy as before;
                    # one that is behind is being caught up, and a second copy would only double the memory
                    storage = copies.storage(index, view)
            elif whole and copies is not None:
                storage = copies.storage(index, view)
            try:
                answer = Reconciler(storage, frame_limit=frame_limit).respond(message)
                if answered is not None:
                    answered("store" if storage is view else "copy")
                return answer
            finally:
                if copies is not None and storage is view:
                    copies.spent(view)
        except ViewChanged as exc:
            raise StoreUnavailable(f"the reconciliation index changed while it was read ({exc}); retry", 1) from None


def discovery(origin: str, *, accepts_offers: bool = False) -> JSONObject:
    """The members the endpoint adds to the §9.2 document.

    ``filters`` names the query parameters that narrow the set; ``frame_limit`` is the size of
    an answer unless the initiator asks for up to ``max_frame_limit`` bytes (``?frame_limit=``:
    fewer, larger rounds when differences are many); ``accepts_offers`` (only when
    true) invites a relay that reconciled with us to ``POST`` the events we lack to our
    ``events`` endpoint.
    """
    member: JSONObject = {"endpoint": origin.rstrip("/") + RECONCILE_PATH, "protocol": PROTOCOL_NAME,
                              "items": "created_at,hash", "frame_limit": DEFAULT_FRAME_LIMIT,
                              "max_message": MAX_MESSAGE, "max_frame_limit": MAX_MESSAGE,
                              "filters": ["since", "until", "type"]}
    if accepts_offers:
        member["accepts_offers"] = True
    return {"reconcile": member}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a peer's discovery document says of its reconciliation, beyond the endpoint."""

    #: its ``events`` endpoint when it invites offers (``reconcile.accepts_offers`` is exactly ``true``)
    offer_url: str | None = None
    #: it takes the ``type`` filter (``reconcile.filters`` lists it)
    types: bool = False
    #: its ``limits.max_envelope_bytes``, when it advertises one
    max_envelope_bytes: int | None = None
    #: the largest answer it gives when asked with ``?frame_limit=`` (``reconcile.max_frame_limit``), if any
    max_frame_limit: int | None = None


def capabilities(doc: object, origin: str, events_url: str | None) -> Capabilities:
    """The :class:`Capabilities` of a discovery document already checked (``validate_discovery``) for ``origin``."""
    if not isinstance(doc, dict):
        return Capabilities()
    member = doc.get("reconcile")
    if not isinstance(member, dict):
        return Capabilities()
    url = events_url or origin + "/v1/knowledge/events"
    offer_url = url if member.get("accepts_offers") is True and url.startswith(origin + "/") else None
    names = member.get("filters")
    limits = doc.get("limits")
    size = limits.get("max_envelope_bytes") if isinstance(limits, dict) else None
    frames = member.get("max_frame_limit")
    return Capabilities(offer_url, isinstance(names, list) and "type" in names,
                        size if type(size) is int and size > 0 else None,
                        min(frames, MAX_MESSAGE) if type(frames) is int and frames >= MIN_FRAME_LIMIT else None)


def advertised_endpoint(doc: object, origin: str) -> str | None:
    """The reconcile endpoint a peer's discovery document advertises on its own origin, else ``None``."""
    member = doc.get("reconcile") if isinstance(doc, dict) else None
    if not isinstance(member, dict) or member.get("protocol") != PROTOCOL_NAME:
        return None
    url = member.get("endpoint")
    if not isinstance(url, str) or not url.startswith(origin + "/") or len(url) > 2048 or "?" in url or "#" in url:
        return None
    return url


# ---- the initiator ---------------------------------------------------------------------------

#: Events offered to one peer per pass by default (``--offer-max``).
OFFER_MAX = 1000
#: Refusals in a row after which the rest of a pass's offers are left for the next reconciliation.
OFFER_REFUSALS_IN_A_ROW = 16
#: Event ids a peer refused that are kept (newest last) so that they are never offered again.
OFFER_REFUSED_KEPT = 1000
#: Largest answer to one offered envelope that is read (the peer echoes the record).
OFFER_ANSWER_BYTES = 1 << 20
#: Longest the offers of one pass may take (a peer that answers each one slowly delays its own pull no more).
OFFER_SECONDS = 60.0


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
    #: the first ``offer_max`` ids of ``have`` (what :func:`offer` may submit to the peer)
    have_ids: list[bytes] = field(default_factory=list, repr=False)
    #: offers: submitted, stored by the peer (new there or already held), refused (4xx), left for later
    offered: int = 0
    offers_accepted: int = 0
    offers_refused: int = 0
    offers_deferred: int = 0
    #: why nothing (or not everything) was offered, for the summary
    offer_note: str | None = None
    window: Filter = NO_FILTER

    def summary(self) -> str:
        if not self.supported:
            return NOT_ADVERTISED
        text = (f"{'reconciled' if self.complete else 'incomplete'}: have {self.have}, need {self.need}, "
                f"{self.rounds} round(s), {self.sent + self.received:,} bytes, {self.batches} batch fetch(es), "
                f"accepted {self.accepted}")
        if self.window != NO_FILTER:
            text += f" ({self.window.describe()})"
        if self.absent:
            text += f", {self.absent} not served by the peer"
        if self.offered or self.offers_deferred:
            text += (f"; offered {self.offered}: {self.offers_accepted} stored, {self.offers_refused} refused"
                     + (f", {self.offers_deferred} left for later" if self.offers_deferred else ""))
        if self.offer_note:
            text += f"; {self.offer_note}"
        return text + (f"; {self.error}" if self.error else "")


def event_id_of(raw: bytes) -> str:
    """The ``hash`` (base64url, unpadded) of a 32-byte id."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def learn(transport: PeerTransport, url: str, index: ReconIndex, result: ReconcileResult, *,
          since: int | None = None, until: int | None = None, max_need: int | None = None,
          deadline: float | None = None, monotonic: Callable[[], float] | None = None,
          progress: Callable[[ReconcileResult], None] | None = None, window: Filter | None = None,
          store: Store | None = None, max_have: int = 0, snapshot_cap: int = SNAPSHOT_CAP,
          answer_limit: int | None = None, kept: KeptCopy | None = None) -> list[bytes]:
    """Run the initiator against ``url``: the ids the peer has and we lack (``result`` counts the rest).

    Until then, each of our steps reads one snapshot of our own index, held only while computing
    (never across a round trip). With a ``type`` filter (``window.types``) our set is read
    once from ``store`` for the session instead. Raises ``ProtocolError`` for a malformed
    answer or too many rounds, ``PeerFetchError`` for a failed request; stops early
    (``complete`` stays false) at the session deadline or once ``max_need`` ids are known.
    The first ``max_have`` ids we have and the peer lacks are kept in ``result.have_ids``.
    ``answer_limit`` (a peer's ``max_frame_limit``) asks for answers of up to that many bytes.
    Once the rounds have read, or can be expected to read, about as many rows of our
    aggregates as our set holds, and if it holds at most ``snapshot_cap`` items, our set is
    copied into memory for the rest of the session (:class:`akrelay.store.recon.OwnSet`). With
    ``kept`` running (the process's :class:`~akrelay.store.recon_copy.KeptCopy`), it is brought up
    to date first (up to :data:`KEPT_WAIT` seconds) and, when current, answers every round.
    """
    from akrelay.federation.transport import PeerFetchError

    monotonic = monotonic or _monotonic
    deadline = SESSION_SECONDS if deadline is None else deadline
    max_need = MAX_NEED if max_need is None else max_need
    window = window if window is not None else Filter(since, until)
    result.window = window
    started = monotonic()
    query = window.query()
    if answer_limit is not None and answer_limit != DEFAULT_FRAME_LIMIT:
        query += ("&" if query else "?") + f"frame_limit={min(max(answer_limit, MIN_FRAME_LIMIT), MAX_MESSAGE)}"
    fixed = None
    if window.types is not None:
        if store is None:
            raise ValueError("a type filter reads our own set through the store: pass store")
        fixed = filtered_items(store, window)
    # our own set: read from the aggregates, and copied into memory once the rounds prove many
    usable = kept if kept is not None and kept.running and fixed is None else None
    own = OwnSet(index, since=window.since, until=window.until, cap=snapshot_cap, kept=usable)
    if usable is not None and own.kept is not None:  # the whole set through the kept copy: up to date first
        usable.refresh(KEPT_WAIT)

    def storage(deferred: int = 0) -> Storage:
        return fixed if fixed is not None else own.storage(deferred)

    with index.recon_snapshot():
        reconciler = Reconciler(storage(), max_rounds=MAX_ROUNDS)
        message: bytes | None = reconciler.initiate()
    need: list[bytes] = []
    deferred = 0  # what the last step left for later (OwnSet: copy when a long sweep is ahead)
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
            reconciler.storage = storage(deferred)
            outcome = reconciler.reconcile(reply)
        deferred = outcome.deferred
        result.have += len(outcome.have)
        room = max_have - len(result.have_ids)
        if room > 0:
            result.have_ids.extend(outcome.have[:room])
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


def offer(engine: SyncEngine, peer: Peer, transport: PeerTransport, events_url: str, st: PeerState,
          result: ReconcileResult, *, limit: int, max_envelope_bytes: int | None = None,
          progress: Callable[[ReconcileResult], None] | None = None) -> None:
    """Submit to the peer what we have and it lacks (``result.have_ids``), as any client would.

    In our ``seq`` order, so that a dependency goes before its dependents; only records
    still fetchable here (retained, not withheld). A 2xx answer counts as stored; a 4xx
    (other than 408/429) as refused, remembered in ``st.offer_refused`` (bounded) and never
    offered again; a 429 or 503 (its ``Retry-After`` kept in ``st.offer_retry_at``), another
    failure, :data:`OFFER_SECONDS` or :data:`OFFER_REFUSALS_IN_A_ROW` refusals in a row end this pass's offers,
    and the rest are counted as deferred: the next reconciliation finds them again.
    """
    from akrelay.federation.transport import PeerFetchError, parse_retry_after

    now = engine.now_ms()
    if st.offer_retry_at and now < st.offer_retry_at:
        result.offers_deferred = result.have
        st.bump("offers_deferred", result.have)
        result.offer_note = "offers wait for the peer's Retry-After"
        return
    refused = set(st.offer_refused)
    ids = [event_id_of(i) for i in result.have_ids]
    ids = [i for i in ids if i not in refused]
    found = engine.relay.store.get_many(ids) if ids else {}
    records = sorted((r for r in found.values() if not r.withheld), key=lambda r: r.seq)[:limit]
    in_a_row = 0
    started = _monotonic()
    for position, record in enumerate(records):
        if _monotonic() - started > OFFER_SECONDS:
            left = len(records) - position
            result.offers_deferred += left
            st.bump("offers_deferred", left)
            result.offer_note = f"offers stopped after {OFFER_SECONDS:.0f} s; the rest wait"
            break
        body = record.canonical_bytes()
        if max_envelope_bytes is not None and len(body) > max_envelope_bytes:
            continue  # the peer says it takes no envelope this large: not worth a request
        try:
            transport.post_json(events_url, body, max_bytes=OFFER_ANSWER_BYTES)
        except PeerFetchError as exc:
            status = exc.status or 0
            if 400 <= status < 500 and status not in (408, 429):
                result.offered += 1
                st.bump("offered")
                result.offers_refused += 1
                st.bump("offers_refused")
                st.offer_refused = [*st.offer_refused, record.id][-OFFER_REFUSED_KEPT:]
                in_a_row += 1
                if in_a_row < OFFER_REFUSALS_IN_A_ROW:
                    continue
                left = len(records) - position - 1
                result.offer_note = f"the peer refused {in_a_row} offers in a row ({exc}); the rest wait"
            else:
                left = len(records) - position  # this one too: it is offered again next time
                wait = parse_retry_after(exc.retry_after, now / 1000) if status in (429, 503) else None
                if wait:
                    st.offer_retry_at = now + int(wait * 1000)
                result.offer_note = f"offers stopped: {str(exc)[:200]}"
            result.offers_deferred += left
            st.bump("offers_deferred", left)
            log.info("sync %s: %s", peer.origin, result.offer_note)
            break
        else:
            in_a_row = 0
            result.offered += 1
            st.bump("offered")
            result.offers_accepted += 1
            st.bump("offers_accepted")
            if progress is not None and result.offered % 100 == 0:
                progress(result)
    if result.have > len(result.have_ids):
        result.offers_deferred += result.have - len(result.have_ids)
        st.bump("offers_deferred", result.have - len(result.have_ids))


def reconcile_peer(engine: SyncEngine, peer: Peer, transport: PeerTransport, url: str, batch_url: str,
                   st: PeerState, pass_result: PassResult, *, since: int | None = None, until: int | None = None,
                   progress: Callable[[ReconcileResult], None] | None = None, window: Filter | None = None,
                   offer_to: str | None = None, offer_limit: int = 0,
                   max_envelope_bytes: int | None = None, answer_limit: int | None = None) -> ReconcileResult:
    """Reconcile with ``peer`` and ingest what it has that we lack, through the engine's own path.

    With ``offer_to`` (the peer's ``events`` endpoint) and ``offer_limit``, what we have and
    it lacks is then offered (:func:`offer`).
    """
    index = index_of(engine.relay.store)
    result = ReconcileResult(peer.origin)
    if index is None:
        result.supported = False
        result.error = "this relay's store keeps no reconciliation index"
        return result
    started = time.monotonic()
    accepted_before = pass_result.accepted
    need = learn(transport, url, index, result, since=since, until=until, progress=progress, window=window,
                 store=engine.relay.store, max_have=offer_limit if offer_to else 0, answer_limit=answer_limit,
                 kept=engine.kept_copy)
    for start in range(0, len(need), BATCH_IDS):
        ids = [event_id_of(i) for i in need[start:start + BATCH_IDS]]
        result.batches += 1
        _, absent = engine.fetch_and_ingest(peer, transport, batch_url, ids, st, pass_result)
        result.absent += absent
        result.accepted = pass_result.accepted - accepted_before
        if progress is not None:
            progress(result)
    if offer_to is not None and result.complete and result.have:
        offer(engine, peer, transport, offer_to, st, result, limit=offer_limit,
              max_envelope_bytes=max_envelope_bytes, progress=progress)
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


def offer_target(engine: SyncEngine, peer: Peer, caps: Capabilities) -> tuple[str | None, str | None]:
    """Where to offer ``have`` (the peer's ``events`` endpoint), or ``None`` and why not."""
    if not engine.options.offer or engine.options.offer_max <= 0:
        return None, "not offered (--no-offer)"
    if not peer.offer:
        return None, "not offered (offer = false in the peer file)"
    if caps.offer_url is None:
        return None, "not offered: the peer does not advertise reconcile.accepts_offers"
    return caps.offer_url, None


def maybe_reconcile(engine: SyncEngine, peer: Peer, transport: PeerTransport, endpoints: dict[str, str],
                    st: PeerState, pass_result: PassResult, *, force: bool = False,
                    progress: Callable[[ReconcileResult], None] | None = None,
                    window: Filter | None = None) -> ReconcileResult | None:
    """Reconcile inside a pass when it is due: on first contact (bootstrap), every ``reconcile_interval``, or ``force``.

    On first contact a complete reconciliation moves our checkpoint for the peer to the
    checkpoint it had before the rounds began, so the pull that follows does not fetch
    again what we already hold from elsewhere (not for a peer with a pinned ``log_key``,
    whose signed log each pass verifies from our checkpoint on, nor for a filtered
    reconciliation, which covers only part of the set). A failed reconciliation never
    fails the pass: it is noted, and the ``after_seq`` pull goes on as before. A
    complete one offers the peer what it lacks when it accepts offers (:func:`offer`).
    """
    from akrelay.federation.transport import PeerFetchError

    window = window or NO_FILTER
    url = endpoints.get("reconcile")
    if url is None:
        st.reconcile_note = NOT_ADVERTISED
        return ReconcileResult(peer.origin, supported=False) if force else None
    index = index_of(engine.relay.store)
    if index is None:
        st.reconcile_note = "this relay's store keeps no reconciliation index: after_seq pulls only"
        return None
    caps = engine.reconcile_caps.get(peer.origin, Capabilities())
    if window.types is not None and not caps.types:
        result = ReconcileResult(peer.origin, error="the peer's reconcile endpoint does not take a type filter",
                                 window=window)
        st.reconcile_note = result.summary()
        return result
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
    whole = window == NO_FILTER
    bootstrap_at = (_bootstrap_checkpoint(transport, endpoints["query"])
                    if first and whole and not peer.log_key else None)
    offer_to, offer_note = offer_target(engine, peer, caps)
    try:
        result = reconcile_peer(engine, peer, transport, url, endpoints["batch"], st, pass_result, progress=progress,
                                window=window, offer_to=offer_to, offer_limit=engine.options.offer_max,
                                max_envelope_bytes=caps.max_envelope_bytes, answer_limit=caps.max_frame_limit)
    except (PeerFetchError, ProtocolError, ViewChanged) as exc:
        message = str(exc) if not isinstance(exc, ProtocolError) else f"{exc.code}: {exc.message}"
        st.last_reconcile = now
        st.reconcile_note = f"reconcile failed ({message[:300]}); pulled after_seq"
        log.warning("sync %s: reconcile failed: %s; pulling after_seq", peer.origin, message)
        return ReconcileResult(peer.origin, error=message, window=window)
    if offer_note and result.have and not result.offer_note:
        result.offer_note = offer_note
    if whole:
        st.last_reconcile = now
    st.reconcile_note = result.summary()
    if result.complete and bootstrap_at is not None and st.checkpoint == 0 and st.resume_seq == 0:
        st.checkpoint = bootstrap_at
        st.peer_checkpoint = max(st.peer_checkpoint, bootstrap_at)
        st.reconcile_note += f"; bootstrapped: pulling after seq {bootstrap_at}"
    log.info("sync %s: %s", peer.origin, st.reconcile_note)
    return result
