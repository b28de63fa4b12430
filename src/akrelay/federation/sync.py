"""The sync engine: replicate every visible record of each configured peer.

One pass per peer reads the peer's discovery document, then enumerates its
``query`` endpoint from the persisted checkpoint (``after_seq``) to the end,
following cursors. Each envelope is submitted to the local
:class:`~akrelay.relay.core.Relay` with ``source="sync"``, the same pipeline
as ``POST /events``, so verification and admission happen in exactly one place
and the peer's ``seq`` and ``accepted_at`` are never copied. The checkpoint is
persisted only after the last page was processed (Knowledge §9.3.2).

An event whose dependencies we lack is resolved from the same peer with
``batch``, dependencies first and within depth, count and byte budgets; if that
fails it is parked in the bounded pending set and retried on later passes, and
the enumeration carries on. A misbehaving peer costs at most its own pass: any
failure is recorded in its state, backs it off, and leaves the other peers and
the store untouched. What a failed pass did verify is kept: the ``seq`` of its
last fully processed page is saved, and the next enumeration resumes after it.

This module is the pass: :meth:`SyncEngine.sync_peer` and :meth:`SyncEngine.run_once` run in the
caller's thread and, with ``SyncOptions(fetch_ahead=False)``, start no thread at all. What runs
passes again and again (a thread per peer, intervals, back-off, push wake-ups) is the scheduler,
:class:`akrelay.federation.scheduler.SyncScheduler`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, TypeVar

import msgspec

from akrelay.federation.peers import Peer, PeerConfigError, canonical_https_origin
from akrelay.federation.push import PushHub
from akrelay.federation.state import PeerState, StateStore
from akrelay.federation.transport import PeerFetchError, PeerTransport, parse_retry_after
from akrelay.leader import LeadershipLost
from akrelay.protocol.discovery import validate_discovery
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.records import check_batch_shape, check_query_shape, check_same_scope
from akrelay.store.base import Record, StoreUnavailable

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from akrelay.federation.reconcile import Capabilities
    from akrelay.federation.witness import Witness
    from akrelay.jsontypes import JSON
    from akrelay.protocol.documents import RecordShape
    from akrelay.protocol.envelope import Envelope
    from akrelay.relay.core import Relay
    from akrelay.store.recon_copy import KeptCopy

_R = TypeVar("_R")

log = logging.getLogger("akrelay.federation")

DISCOVERY_PATH = "/.well-known/agent-knowledge"
DEFAULT_PATHS = {"query": "/v1/knowledge/query", "batch": "/v1/knowledge/batch"}
#: Errors after which an envelope might still be accepted later (not a verdict on the event).
RETRYABLE_CODES = frozenset({"missing_dependency", "timestamp_out_of_window", "rate_limited"})
BATCH_MAX_IDS = 100
#: Recent cursors remembered (as digests) to name a cursor loop early; strict ``seq``
#: progress and the empty-page limit are what make every loop end.
RECENT_CURSORS = 64
#: Above this share of ``max_page_bytes`` a page is ingested before the next one is fetched,
#: so that at most one large page is held in memory at a time.
PREFETCH_BELOW = 4


def encode_json(value: object) -> bytes:
    """Bytes to submit for an envelope parsed from a peer's page.

    The page was parsed as strict I-JSON, so plain re-encoding preserves every
    value; ``verify_envelope`` (inside ``Relay.submit``) then parses these bytes
    and computes the JCS form itself. msgspec is several times faster than JCS
    here, and catch-up speed is bounded by this loop.
    """
    try:
        return msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(str(exc)) from None


@dataclass(slots=True)
class _Step:
    """One envelope on the dependency stack: ``need`` is its missing IDs, or None to submit it now."""

    raw: bytes
    depth: int
    need: list[str] | None


class PeerMisbehaved(Exception):
    """The peer answered, but not as the protocol requires; the pass stops."""


@dataclass(frozen=True, slots=True)
class SyncOptions:
    """Engine-wide bounds; per-peer limits live in :class:`~akrelay.federation.peers.Peer`."""

    own_origin: str | None = None
    #: Longest dependency chain fetched with ``batch`` for one event.
    max_depth: int = 32
    #: Most dependency envelopes fetched for one event.
    max_dependency_events: int = 1000
    #: Consecutive empty pages that still carry ``next_cursor``.
    max_empty_pages: int = 8
    #: Pending entries retried per pass and peer.
    pending_retry_limit: int = 1000
    #: Longest exponential back-off after failures (a Retry-After may ask for longer).
    max_backoff: float = 300.0
    #: Envelopes committed together in the first pass over a page (``Relay.check`` each,
    #: then one ``Relay.commit_admitted`` per group: one transaction instead of one
    #: per event). ``1`` submits one at a time through ``Relay.submit``.
    group_size: int = 256
    #: Follow ``peers`` hints from discovery documents (never by default, §9.2).
    follow_hints: bool = False
    hint_hops: int = 1
    hint_count: int = 8
    #: Reconcile with peers that advertise it (issue 26, :mod:`akrelay.federation.reconcile`): on first
    #: contact, then every ``reconcile_interval`` seconds (0: first contact and on demand only).
    reconcile: bool = True
    reconcile_interval: float = 3600.0
    #: After a complete reconciliation, offer a peer that advertises ``reconcile.accepts_offers`` the
    #: events we hold and it lacks, at most ``offer_max`` per pass (:func:`akrelay.federation.reconcile.offer`).
    offer: bool = True
    offer_max: int = 1000
    #: Fetch a small page's successor in a helper thread while the page is ingested; ``False``: every
    #: page is fetched in the pass's own thread, so a pass starts no thread.
    fetch_ahead: bool = True


@dataclass(slots=True)
class PassResult:
    """What one pass over one peer did."""

    origin: str
    ok: bool = False
    skipped: bool = False
    error: str | None = None
    pages: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    resolved: int = 0
    pending: int = 0
    checkpoint: int | None = None
    rejections: list[tuple[str, str]] = field(default_factory=list)


class _Budget:
    def __init__(self, events: int, nbytes: int) -> None:
        self.events = events
        self.nbytes = nbytes

    def charge(self, events: int, nbytes: int) -> bool:
        self.events -= events
        self.nbytes -= nbytes
        return self.events >= 0 and self.nbytes >= 0


class _Inline:
    """An executor that runs each call at once in the calling thread (a pass without fetch-ahead)."""

    def submit(self, fn: Callable[..., _R], *args: object) -> Future[_R]:
        done: Future[_R] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future, as a pool would
            done.set_exception(exc)
        return done

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing runs in the background."""


class SyncEngine:
    """Replicates from a set of peers into one relay."""

    def __init__(self, relay: Relay, state: StateStore, peers: Iterable[Peer],
                 options: SyncOptions | None = None, *,
                 transport_factory: Callable[[Peer], PeerTransport] = PeerTransport,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 witness: tuple[str, Ed25519PrivateKey] | None = None) -> None:
        self.relay = relay
        #: (our log name, our Ed25519 log key): cosign each peer checkpoint we verified (issue 23)
        self.witness = witness
        #: Where the witness records the latest checkpoint it cosigned per log (federation.witness); set by
        #: build_engine, so a verified checkpoint is cosigned only if consistent with what was cosigned before.
        self.witness_log: Witness | None = None
        self.state = state
        self.options = options or SyncOptions()
        self._transport_factory = transport_factory
        self._clock_ms = clock_ms
        own = None
        if self.options.own_origin:
            try:
                own = canonical_https_origin(self.options.own_origin)
            except PeerConfigError:
                own = None
        self.own_origin = own
        peers = list(peers)
        self.peers = [p for p in peers if p.origin != own]
        #: Configured peers on this relay's own origin: never synced, and said so (a mesh file may list us).
        self.skipped_self = [p.origin for p in peers if p.origin == own]
        for origin in self.skipped_self:
            log.warning("sync: not syncing from %s: it is this relay's own origin (set --origin if it is not)",
                        origin)
        #: origin -> (peer, hop) for hinted peers (only with ``follow_hints``).
        self.hinted: dict[str, tuple[Peer, int]] = {}
        #: origin -> the push stream its discovery advertises (None: it has none), and the subscriptions
        #: that the scheduler holds to them (:mod:`akrelay.federation.push`, :mod:`akrelay.federation.scheduler`)
        self.streams: dict[str, str | None] = {}
        self.push = PushHub(transport_factory)
        #: origin -> what its discovery says of reconciliation: offers, filters, envelope limit (issue 26)
        self.reconcile_caps: dict[str, Capabilities] = {}
        #: the node's kept copy of our reconciliation set (set by :func:`akrelay.federation.runner.build_engine`)
        self.kept_copy: KeptCopy | None = None

    # -- public API ---------------------------------------------------------

    def run_once(self, *, force: bool = False) -> list[PassResult]:
        """One pass over every enabled peer (then hinted ones); a failing peer never stops the rest."""
        results = [self.sync_peer(peer, force=force) for peer in self.peers if peer.enabled]
        done: set[str] = {r.origin for r in results}
        while True:
            todo = [(p, hop) for origin, (p, hop) in list(self.hinted.items()) if origin not in done]
            if not todo:
                break
            for peer, hop in todo:
                done.add(peer.origin)
                results.append(self.sync_peer(peer, force=force, hop=hop))
        return results

    def sync_peer(self, peer: Peer, *, force: bool = False, hop: int = 0) -> PassResult:
        """One complete pass over ``peer``: discovery, pending retries, enumeration, checkpoint."""
        result = PassResult(peer.origin)
        st = self.state.get(peer.origin)
        now = self._clock_ms()
        if st.misbehaving:  # its log did not verify: nothing more is pulled until an operator clears it
            result.skipped = True
            result.error = f"misbehaving: {st.misbehaving}"
            return result
        if not force and st.retry_at and now < st.retry_at:
            result.skipped = True
            result.error = st.last_error
            return result
        st.last_attempt = now
        st.bump("passes")
        try:
            with self.push.transport(peer) as transport:  # a fresh one, or the one kept while pushed
                endpoints = self._discover(peer, transport, hop)
                self._retry_pending(peer, transport, endpoints["batch"], st, result)
                if self.options.reconcile:
                    from akrelay.federation.reconcile import maybe_reconcile

                    maybe_reconcile(self, peer, transport, endpoints, st, result)
                self._enumerate(peer, transport, endpoints, st, result)
        except (PeerFetchError, PeerMisbehaved, ProtocolError, StoreUnavailable) as exc:
            self._fail(peer, st, result, exc)
        except LeadershipLost:
            raise
        except Exception as exc:  # a bug or a local failure must not end the other peers' passes
            log.exception("sync pass for %s failed unexpectedly", peer.origin)
            self._fail(peer, st, result, PeerMisbehaved(f"internal error: {type(exc).__name__}: {exc}"))
        else:
            st.last_success = self._clock_ms()
            st.last_error = None
            st.consecutive_failures = 0
            st.retry_at = 0
            result.ok = True
        finally:
            st.push = (self.push.describe(peer.origin, advertised=self.streams.get(peer.origin) is not None)
                       if peer.push else "polled (push = false in the peer file)")
            self.state.put(st)
        return result

    # -- discovery ----------------------------------------------------------

    def _discover(self, peer: Peer, transport: PeerTransport, hop: int) -> dict[str, str]:
        """Read and check the peer's own discovery document; advertised endpoints win over defaults."""
        doc = transport.get_json(peer.origin + DISCOVERY_PATH, max_bytes=min(peer.max_page_bytes, 1 << 20))
        if not isinstance(doc, dict) or doc.get("service") != peer.origin:
            service = doc.get("service") if isinstance(doc, dict) else None
            if not isinstance(service, str):
                raise PeerMisbehaved(f"discovery document names service {service!r}, not {peer.origin}")
            raise PeerMisbehaved(f"the peer configured as {peer.origin} says its origin is {service!r}; "
                                 "configure the peer by the origin it serves (a relay on 127.0.0.1 without "
                                 "--origin serves https://localhost:PORT)")
        try:
            discovery = validate_discovery(doc, peer.origin)
        except ProtocolError as exc:
            raise PeerMisbehaved(f"invalid discovery document: {exc.message}") from None
        endpoints = {name: discovery.endpoints.get(name, peer.origin + path) for name, path in DEFAULT_PATHS.items()}
        for name, url in endpoints.items():  # validate_discovery checks this too; never trust one check
            if not url.startswith(peer.origin + "/"):
                raise PeerMisbehaved(f"discovery endpoint {name!r} is not on {peer.origin}: {url!r}")
        from akrelay.federation.reconcile import Capabilities, advertised_endpoint, capabilities

        reconcile_url = advertised_endpoint(doc, peer.origin)
        if reconcile_url is not None:
            endpoints["reconcile"] = reconcile_url
        self.reconcile_caps[peer.origin] = (capabilities(doc, peer.origin, discovery.endpoints.get("events"))
                                            if reconcile_url is not None else Capabilities())
        if self.options.follow_hints and hop < self.options.hint_hops:
            self._note_hints(list(discovery.peers), hop + 1)
        self.streams[peer.origin] = discovery.stream if peer.push else None
        return endpoints

    def _note_hints(self, hints: object, hop: int) -> None:
        """Remember hinted origins, bounded by count and hops; they get default, public-only settings."""
        if not isinstance(hints, list):
            return
        configured = {p.origin for p in self.peers}
        for hint in hints[:32]:
            if len(self.hinted) >= self.options.hint_count:
                return
            try:
                origin = canonical_https_origin(hint)
            except PeerConfigError:
                continue
            if origin in configured or origin == self.own_origin or origin in self.hinted:
                continue
            self.hinted[origin] = (Peer(origin=origin), hop)

    # -- enumeration --------------------------------------------------------

    def _enumerate(self, peer: Peer, transport: PeerTransport, endpoints: dict[str, str],
                   st: PeerState, result: PassResult) -> None:
        """Follow the query from where we stopped to its last page, then persist the peer's checkpoint.

        A small page's successor is fetched while it is ingested. Loop detection
        takes constant memory: every page must either move ``seq`` forward or be
        one of at most ``max_empty_pages`` consecutive empty ones, and the last
        cursors are remembered as digests only. If the pass fails, the ``seq`` of
        the last fully processed page is saved (``resume_seq``), so verified work
        is not repeated; the checkpoint itself moves only after the last page (§9.3.2).
        """
        after_seq = max(st.checkpoint, st.resume_seq)
        base = {"after_seq": str(after_seq), "limit": str(peer.page_limit)}
        recent: deque[bytes] = deque(maxlen=RECENT_CURSORS)
        scope: tuple[int, int] | None = None  # (checkpoint, as_of) of the first page
        last_seq = after_seq
        empty_run = 0
        pages = 0
        fetcher: ThreadPoolExecutor | _Inline = (ThreadPoolExecutor(1, thread_name_prefix="akrelay-sync-fetch")
                                                 if self.options.fetch_ahead else _Inline())
        query = endpoints["query"]
        #: seq -> event hash of every record pulled, matched against the peer's signed log (``log_key``)
        pulled: dict[int, object] | None = {} if peer.log_key else None
        try:
            future: Future[tuple[JSON, int]] | None = fetcher.submit(transport.get_json_sized, query, dict(base))
            while True:
                assert future is not None  # submitted before the loop and at the end of every page
                page, size = future.result()
                future = None
                pages += 1
                result.pages += 1
                st.bump("pages")
                records, nxt, page_scope = self._check_page(peer, page, scope, after_seq, last_seq)
                if scope is None:
                    scope = page_scope
                    st.peer_checkpoint = scope[0]
                del page
                if nxt is not None:
                    digest = hashlib.blake2b(nxt.encode(), digest_size=16).digest()
                    if digest in recent:
                        raise PeerMisbehaved("the peer returned a cursor it had already returned (cursor loop)")
                    recent.append(digest)
                    empty_run = empty_run + 1 if not records else 0
                    if empty_run > self.options.max_empty_pages:
                        raise PeerMisbehaved(f"{empty_run} consecutive empty pages with a next_cursor")
                    if pages < peer.max_pages and size * PREFETCH_BELOW <= peer.max_page_bytes:
                        future = fetcher.submit(transport.get_json_sized, query, dict(base, cursor=nxt))
                self._ingest_page(peer, transport, endpoints["batch"], [r["envelope"] for r in records], st, result)
                if pulled is not None:
                    pulled.update((r["seq"], r["envelope"]["hash"]) for r in records)
                if records:
                    last_seq = records[-1]["seq"]
                del records
                if nxt is None:
                    break
                if pages >= peer.max_pages:  # after ingesting it, so that this page's work is kept too
                    raise PeerMisbehaved(f"enumeration exceeded {peer.max_pages} pages")
                if future is None:
                    future = fetcher.submit(transport.get_json_sized, query, dict(base, cursor=nxt))
        except BaseException:
            if last_seq > st.resume_seq and last_seq > st.checkpoint:
                st.resume_seq = last_seq  # every record up to here was submitted: keep that work
            raise
        finally:
            fetcher.shutdown(wait=True, cancel_futures=True)
        # Every page has been processed: only now may the checkpoint move (§9.3.2).
        assert scope is not None
        if pulled is not None:
            st.checkpoint = self._check_log(peer, transport, endpoints, st, pulled, after_seq, scope[0])
        else:
            st.checkpoint = scope[0]
        st.resume_seq = 0
        result.checkpoint = st.checkpoint

    def _check_log(self, peer: Peer, transport: PeerTransport, endpoints: dict[str, str], st: PeerState,
                   pulled: dict[int, object], after_seq: int, snapshot: int) -> int:
        """Verify the peer's signed Merkle log against this pass (:mod:`akrelay.federation.logcheck`).

        A fork, a rewrite or a missing record marks the peer misbehaving, keeps the
        evidence in its state and fails the pass; later passes pull nothing from it.
        """
        from akrelay.federation.logcheck import LogMisbehaved, check_pass

        def batch(ids: list[str]) -> Mapping[str, object]:
            page = transport.post_json(endpoints["batch"], encode_json({"hashes": ids}), max_bytes=peer.max_page_bytes)
            return page if isinstance(page, dict) else {}

        try:
            covered = check_pass(peer, transport, st, pulled, after_seq, snapshot, batch)
            if self.witness is not None and st.log_note:  # only after the consistency check passed
                from akrelay.protocol.note import NoteError, cosign, parse_note

                if self.witness_log is not None:  # one record per log with the add-checkpoint API's
                    from akrelay.federation.logcheck import CONSISTENCY_PATH

                    def proof(first: int, second: int) -> list[str]:
                        try:
                            body = transport.get_json(peer.origin + CONSISTENCY_PATH,
                                                      {"from": str(first), "to": str(second)})
                        except PeerFetchError as exc:
                            if exc.kind == "status":  # a 4xx: it will not prove what it signed, a failed proof
                                return []
                            raise  # an outage or a timeout: no cosignature this pass, nothing held against it
                        hashes = body.get("hashes") if isinstance(body, dict) else None
                        return [h for h in hashes if isinstance(h, str)] if isinstance(hashes, list) else []

                    try:
                        st.cosigned = self.witness_log.after_sync(st.log_note, proof)
                    except NoteError as exc:
                        raise LogMisbehaved(f"the peer's checkpoint passed but {exc}", {"new": st.log_note}) from None
                    except (PeerFetchError, ProtocolError, StoreUnavailable) as exc:  # not cosigned this time
                        log.warning("sync %s: no witness cosignature this pass: %s", peer.origin, exc)
                else:
                    name, key = self.witness
                    st.cosigned = cosign(parse_note(st.log_note), name, key, self._clock_ms() // 1000).encode()
            return covered
        except LogMisbehaved as exc:
            st.misbehaving = exc.reason
            st.evidence = exc.evidence
            log.error("sync %s: the peer's Merkle log does not verify: %s; it is now marked misbehaving",
                      peer.origin, exc.reason)
            raise PeerMisbehaved(f"misbehaving: {exc.reason}") from None

    def _ingest_page(self, peer: Peer, transport: PeerTransport, batch_url: str, envelopes: list[dict[str, object]],
                     st: PeerState, result: PassResult) -> None:
        """Submit a page's envelopes in committed groups, then give the ones that lacked a
        dependency the full treatment in page order (a dependency in the same page is committed by then)."""
        if self.options.group_size <= 1 or len(envelopes) < 2:
            for envelope in envelopes:
                self._ingest(peer, transport, batch_url, envelope, st, result)
            return
        outcomes = self._first_pass(envelopes)
        for envelope, (outcome, event_id, error) in zip(envelopes, outcomes):
            if outcome == "accepted":
                result.accepted += 1
                st.bump("accepted")
            elif outcome == "duplicate":
                result.duplicates += 1
                st.bump("duplicates")
            elif outcome == "rejected":
                self._rejected(st, result, event_id, error or "rejected")
            else:
                self._ingest(peer, transport, batch_url, envelope, st, result)

    def _first_pass(self, envelopes: list[dict[str, object]]) -> list[tuple[str, str, str | None]]:
        """§8.1 steps 1–6 for each envelope in page order, step 7 once per group.

        Outcomes are ``accepted``, ``duplicate``, ``rejected`` or ``retry`` (dependency
        work needed). A ``missing_dependency`` while admitted envelopes wait uncommitted
        first commits them (the dependency may be among them) and checks once more, so
        page order and in-page dependencies behave exactly as one-at-a-time submission.
        """
        outcomes: list[tuple[str, str, str | None]] = [("retry", "?", None)] * len(envelopes)
        admitted: list[tuple[int, str, Envelope, int]] = []

        def flush() -> None:
            if admitted:
                results = self.relay.commit_admitted([(env, now) for _, _, env, now in admitted])
                for (i, event_id, _, _), (_, created) in zip(admitted, results):
                    outcomes[i] = ("accepted" if created else "duplicate"), event_id, None
                admitted.clear()

        for i, envelope in enumerate(envelopes):
            claimed = envelope.get("hash")
            event_id = claimed if isinstance(claimed, str) else "?"
            try:
                raw = encode_json(envelope)
            except (ProtocolError, TypeError, ValueError) as exc:
                outcomes[i] = "rejected", event_id, f"invalid_event: {exc}"
                continue
            try:
                try:
                    existing, env, now = self.relay.check(raw)
                except ProtocolError as exc:
                    if exc.code != "missing_dependency" or not admitted:
                        raise
                    flush()
                    existing, env, now = self.relay.check(raw)
            except ProtocolError as exc:
                if exc.code in RETRYABLE_CODES:
                    outcomes[i] = "retry", event_id, None
                else:
                    outcomes[i] = "rejected", event_id, f"{exc.code}: {exc.message}"
                continue
            if existing is not None:
                outcomes[i] = "duplicate", event_id, None
                continue
            admitted.append((i, event_id, env, now))
            if len(admitted) >= self.options.group_size:
                flush()
        flush()
        return outcomes

    def close(self) -> None:
        """End the push subscriptions and release the witness records' connection (passes hold no threads)."""
        self.push.close()
        if self.witness_log is not None:
            self.witness_log.state.close()

    def _check_page(self, peer: Peer, page: object, scope: tuple[int, int] | None, after_seq: int,
                    last_seq: int) -> tuple[list[RecordShape], str | None, tuple[int, int]]:
        """The §9.3.2 response rules a client can check; anything else is peer misbehaviour.

        The shape of one page is the protocol core's (:func:`check_query_shape`);
        the rules across pages of one enumeration are checked here.
        """
        try:
            records, nxt = check_query_shape(page, peer.origin, after_seq=last_seq, limit=peer.page_limit)
            if not isinstance(page, dict):  # check_query_shape refused anything else already
                raise ProtocolError("invalid_response", "response must be an object")
            page_scope = check_same_scope(scope, page)
        except ProtocolError as exc:
            raise PeerMisbehaved(f"invalid query page: {exc.message}") from None
        checkpoint = page_scope[0]
        if scope is None and checkpoint < after_seq:
            raise PeerMisbehaved(f"peer checkpoint {checkpoint} is below our position {after_seq} "
                                 "(the peer reset its sequence without changing origin)")
        if nxt is not None and len(nxt) > 4096:
            raise PeerMisbehaved("next_cursor is longer than 4096 characters")
        return records, nxt, page_scope

    # -- ingestion ----------------------------------------------------------

    def _submit(self, raw: bytes) -> tuple[Record, bool]:
        record, created = self.relay.submit(raw, source="sync")
        return record, created

    def _ingest(self, peer: Peer, transport: PeerTransport, batch_url: str, envelope: dict[str, object],
                st: PeerState, result: PassResult) -> None:
        try:
            raw = encode_json(envelope)
        except (ProtocolError, TypeError, ValueError) as exc:
            self._rejected(st, result, str(envelope.get("hash")), f"invalid_event: {exc}")
            return
        claimed = envelope.get("hash")
        event_id = claimed if isinstance(claimed, str) else "?"
        outcome, missing, error = self._ingest_with_dependencies(peer, transport, batch_url, raw, st, result)
        if outcome == "accepted":
            result.accepted += 1
            st.bump("accepted")
        elif outcome == "duplicate":
            result.duplicates += 1
            st.bump("duplicates")
        elif outcome == "pending":
            self._park(peer, st, result, event_id, raw, missing)
        else:
            self._rejected(st, result, event_id, error or "rejected")

    def _rejected(self, st: PeerState, result: PassResult, event_id: str, reason: str) -> None:
        result.rejected += 1
        st.bump("rejected")
        if len(result.rejections) < 100:
            result.rejections.append((event_id, reason))
        log.info("sync %s: rejected %s: %s", st.origin, event_id, reason)

    def _park(self, peer: Peer, st: PeerState, result: PassResult, event_id: str, raw: bytes,
              missing: list[str]) -> None:
        fresh = not self.state.is_pending(peer.origin, event_id)
        evicted = self.state.add_pending(peer.origin, event_id, raw, missing, self._clock_ms())
        if fresh:
            result.pending += 1
            st.bump("pending_added")
        if evicted:
            st.bump("pending_dropped", evicted)

    def _ingest_with_dependencies(self, peer: Peer, transport: PeerTransport, batch_url: str, raw: bytes,
                                  st: PeerState, result: PassResult) -> tuple[str, list[str], str | None]:
        """Submit ``raw``, fetching missing dependencies from the peer first.

        Returns ``(outcome, missing, error)`` where outcome is ``accepted``,
        ``duplicate``, ``pending`` (dependencies unobtainable or not yet valid)
        or ``rejected``. Dependencies are submitted before their dependents
        (a stack), so nothing is ever accepted ahead of what it refers to.
        """
        try:
            _, created = self._submit(raw)
            return ("accepted" if created else "duplicate"), [], None
        except ProtocolError as exc:
            if exc.code != "missing_dependency":
                return ("pending" if exc.code in RETRYABLE_CODES else "rejected"), [], f"{exc.code}: {exc.message}"
            missing = _missing_of(exc)
        budget = _Budget(self.options.max_dependency_events, peer.max_batch_bytes)
        fetched: set[str] = set()
        # Stack items: (raw, depth, missing-or-None); None means "submit it now".
        stack: list[_Step] = [_Step(raw, 0, missing)]
        while stack:
            item = stack[-1]
            dep_raw, depth, need = item.raw, item.depth, item.need
            if need is None:
                try:
                    _, created = self._submit(dep_raw)
                except ProtocolError as exc:
                    if exc.code != "missing_dependency":
                        return "pending", missing, f"dependency rejected: {exc.code}: {exc.message}"
                    need = _missing_of(exc)
                else:
                    stack.pop()
                    if not stack:
                        return ("accepted" if created else "duplicate"), [], None
                    if created:
                        result.resolved += 1
                        st.bump("resolved")
                    continue
            todo = [m for m in need if m not in fetched]
            if not todo or depth >= self.options.max_depth:
                return "pending", missing, "dependency chain too deep or cyclic"
            try:
                envelopes, absent = self._batch(peer, transport, batch_url, todo, budget)
            except (PeerFetchError, PeerMisbehaved) as exc:
                # A broken batch endpoint costs only the events that needed it: they wait in
                # the pending set while the enumeration (and the checkpoint) moves on.
                st.bump("batch_errors")
                st.last_batch_error = str(exc)[:500]
                log.warning("sync %s: batch failed: %s", peer.origin, exc)
                return "pending", missing, f"batch failed: {exc}"
            if absent:
                return "pending", missing, f"peer lacks dependencies {absent[:3]}"
            fetched.update(todo)
            item.need = None
            for dep in envelopes:
                stack.append(_Step(dep, depth + 1, None))
        return "pending", missing, "unreachable"  # pragma: no cover

    def _batch(self, peer: Peer, transport: PeerTransport, batch_url: str, ids: list[str],
               budget: _Budget) -> tuple[list[bytes], list[str]]:
        """Fetch exact IDs with ``batch`` (§9.4), in chunks of 100, within ``budget``."""
        out: list[bytes] = []
        absent: list[str] = []
        for i in range(0, len(ids), BATCH_MAX_IDS):
            chunk = ids[i:i + BATCH_MAX_IDS]
            if budget.events < len(chunk):
                return out, chunk[budget.events:] + ids[i + BATCH_MAX_IDS:]
            body = encode_json({"hashes": chunk})
            try:
                response = transport.post_json(batch_url, body,
                                               max_bytes=max(1024, min(budget.nbytes, peer.max_page_bytes)))
            except PeerFetchError as exc:
                if exc.kind != "too_large":
                    raise
                # Over our byte budget: the event waits (pending); the peer did nothing wrong.
                return out, ids[i:]
            try:
                records, _ = check_batch_shape(response, chunk, peer.origin)
            except ProtocolError as exc:
                raise PeerMisbehaved(f"invalid batch response: {exc.message}") from None
            # keyed by the claimed hash, which check_batch_shape matched against the requested IDs
            got: dict[object, bytes] = {record["envelope"]["hash"]: encode_json(record["envelope"]) for record in records}
            if not budget.charge(len(got), sum(len(v) for v in got.values())):
                return out, [h for h in chunk if h not in got] or chunk
            out.extend(got[h] for h in chunk if h in got)
            absent.extend(h for h in chunk if h not in got)
        return out, absent

    def _retry_pending(self, peer: Peer, transport: PeerTransport, batch_url: str, st: PeerState,
                       result: PassResult) -> None:
        """Retry parked events oldest first; accepted or definitively rejected ones leave the set.

        Every entry is resubmitted locally on every pass (cheap: its dependencies may
        have arrived from anywhere), but the peer is asked for them again only when
        the entry's back-off (interval x 2^attempts, at most ``max_backoff``) is over.
        """
        now = self._clock_ms()
        for entry in self.state.pending(peer.origin, limit=self.options.pending_retry_limit):
            if entry.retry_at > now:
                outcome, error = self._local_retry(entry.raw)
                if outcome == "pending":
                    continue
                missing: list[str] = []
            else:
                outcome, missing, error = self._ingest_with_dependencies(peer, transport, batch_url, entry.raw,
                                                                         st, result)
            if outcome == "pending":
                delay = min(self.options.max_backoff, peer.interval * 2 ** min(entry.attempts, 16))
                self.state.add_pending(peer.origin, entry.event_id, entry.raw, missing or entry.missing,
                                       now, retry_at=now + int(delay * 1000))
                continue
            self.state.remove_pending(peer.origin, entry.event_id)
            if outcome in ("accepted", "duplicate"):
                st.bump("pending_accepted")
                if outcome == "accepted":
                    result.accepted += 1
                    st.bump("accepted")
            else:
                self._rejected(st, result, entry.event_id, error or "rejected")

    def _local_retry(self, raw: bytes) -> tuple[str, str | None]:
        try:
            _, created = self._submit(raw)
        except ProtocolError as exc:
            if exc.code in RETRYABLE_CODES:
                return "pending", None
            return "rejected", f"{exc.code}: {exc.message}"
        return ("accepted" if created else "duplicate"), None

    # -- for set reconciliation (issue 26, :mod:`akrelay.federation.reconcile`) -----------------

    def now_ms(self) -> int:
        return self._clock_ms()

    def open_transport(self, peer: Peer) -> PeerTransport:
        return self._transport_factory(peer)

    def discover(self, peer: Peer, transport: PeerTransport) -> dict[str, str]:
        return self._discover(peer, transport, 0)

    def fetch_and_ingest(self, peer: Peer, transport: PeerTransport, batch_url: str, ids: list[str],
                         st: PeerState, result: PassResult) -> tuple[int, int]:
        """Fetch exact ids (at most 100) with ``batch`` and ingest them exactly as pulled events are: (served, absent)."""
        envelopes, absent = self._batch(peer, transport, batch_url, ids, _Budget(len(ids), peer.max_page_bytes))
        self._ingest_page(peer, transport, batch_url, [msgspec.json.decode(raw) for raw in envelopes], st, result)
        return len(envelopes), len(absent)

    # -- failure ------------------------------------------------------------

    def _fail(self, peer: Peer, st: PeerState, result: PassResult, exc: Exception) -> None:
        message = str(exc) if not isinstance(exc, ProtocolError) else f"{exc.code}: {exc.message}"
        st.last_error = message[:500]
        st.consecutive_failures += 1
        st.bump("failed_passes")
        delay = min(self.options.max_backoff, peer.interval * (2 ** min(st.consecutive_failures - 1, 16)))
        retry_after = parse_retry_after(getattr(exc, "retry_after", None), self._clock_ms() / 1000)
        if retry_after is not None:
            delay = max(delay, retry_after)
        st.retry_at = self._clock_ms() + int(delay * 1000)
        result.error = st.last_error
        log.warning("sync %s failed: %s (next try in %.1fs)", peer.origin, st.last_error, delay)


def _missing_of(exc: ProtocolError) -> list[str]:
    data = exc.data or {}
    missing = data.get("missing") if isinstance(data, dict) else None
    return [m for m in missing if isinstance(m, str)] if isinstance(missing, list) else []
