"""The relay service: Agent Knowledge §8 acceptance and §9 reads over one store.

This is the only place where the protocol core meets storage, so acceptance
from HTTP, from a peer and from the CLI is one code path. Handlers stay thin:
every method takes wire input (bytes or decoded pairs), raises
:class:`ProtocolError` for every refusal, and returns objects whose
``to_json()`` splices the stored canonical envelope bytes instead of
re-encoding envelopes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NotRequired, Sequence, TypedDict

import msgspec

from akrelay.protocol.b64 import b64decode_canonical
from akrelay.protocol.cursor import CursorCodec, CursorState
from akrelay.protocol.dependencies import check_targets, links
from akrelay.protocol.discovery import build_discovery
from akrelay.protocol.envelope import Envelope, verify_envelope
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.limits import check_limits
from akrelay.protocol.payload import check_payload_rules
from akrelay.protocol.query import parse_query, request_terms
from akrelay.protocol.reads import parse_batch_request, parse_read_json
from akrelay.protocol.timestamps import check_created_at
from akrelay.relay.config import RelayConfig
from akrelay.store.base import Record, Store
from akrelay.store.capabilities import Watchable, store_directory

if TYPE_CHECKING:
    import redis

    from akrelay.protocol.documents import AcceptanceRecord

_json = msgspec.json.encode

log = logging.getLogger("akrelay.relay")


def ms_clock() -> int:
    """Service time in Unix milliseconds (Identity §8.3 ``accepted_at``)."""
    return time.time_ns() // 1_000_000


def _records_json(records: Sequence[Record]) -> bytes:
    return b"[" + b",".join(r.to_json() for r in records) + b"]"


class QueryPageObject(TypedDict):
    """A §9.3.2 page as JSON values (:meth:`QueryPage.to_dict`)."""

    result: list[AcceptanceRecord]
    service: str
    checkpoint: int
    as_of: int
    next_cursor: NotRequired[str]


class BatchPageObject(TypedDict):
    """A §9.4 response as JSON values (:meth:`BatchPage.to_dict`)."""

    result: list[AcceptanceRecord]
    missing: list[str]
    service: str
    checkpoint: int
    as_of: int


@dataclasses.dataclass(frozen=True, slots=True)
class QueryPage:
    """One §9.3.2 page; ``next_cursor`` is set exactly when another page follows."""

    records: list[Record]
    service: str
    checkpoint: int
    as_of: int
    next_cursor: str | None = None

    def to_dict(self) -> QueryPageObject:
        body: QueryPageObject = {
            "result": [r.to_dict() for r in self.records],
            "service": self.service,
            "checkpoint": self.checkpoint,
            "as_of": self.as_of,
        }
        if self.next_cursor is not None:
            body["next_cursor"] = self.next_cursor
        return body

    def to_json(self) -> bytes:
        cursor = b',"next_cursor":' + _json(self.next_cursor) if self.next_cursor is not None else b""
        return b'{"as_of":%d,"checkpoint":%d%b,"result":%b,"service":%b}' % (
            self.as_of, self.checkpoint, cursor, _records_json(self.records), _json(self.service)
        )


@dataclasses.dataclass(frozen=True, slots=True)
class BatchPage:
    """A §9.4 response: both partitions keep the request order."""

    records: list[Record]
    missing: list[str]
    service: str
    checkpoint: int
    as_of: int

    def to_dict(self) -> BatchPageObject:
        return {
            "result": [r.to_dict() for r in self.records],
            "missing": list(self.missing),
            "service": self.service,
            "checkpoint": self.checkpoint,
            "as_of": self.as_of,
        }

    def to_json(self) -> bytes:
        return b'{"as_of":%d,"checkpoint":%d,"missing":%b,"result":%b,"service":%b}' % (
            self.as_of, self.checkpoint, _json(self.missing), _records_json(self.records), _json(self.service)
        )


@dataclasses.dataclass(slots=True)
class PendingCheck:
    """A :meth:`Relay.check_local` that stopped where §8.1 must ask the store; :meth:`Relay.finish_check` goes on.

    Either step 5 has targets to resolve (``refusal`` is ``None``), or steps 3–6
    refused and step 2 must say whether the envelope is already retained.
    """

    envelope: Envelope
    size: int
    accepted_at: int
    refusal: ProtocolError | None = None


class Relay:
    """Acceptance, lookup, query, batch, withholding and discovery for one origin."""

    def __init__(
        self,
        store: Store,
        config: RelayConfig | None = None,
        *,
        clock: Callable[[], int] = ms_clock,
        cursor_secret: bytes,
        data_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.store = store
        if data_dir is None:
            data_dir = store_directory(store)  # an embedded store's directory
        #: where this node keeps derived state (search index, KIP nexus); ``None``: in memory
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.config = config or RelayConfig()
        self.clock = clock
        self._cursors = CursorCodec(cursor_secret)
        self._limits = dataclasses.replace(self.config.limits, max_envelope_bytes=self.config.max_envelope_bytes)
        #: Called after a commit in this process that accepted something (see :meth:`on_commit`).
        self._commit_listeners: list[Callable[[], None]] = []
        self._unwatch: Callable[[], None] | None = None
        #: between :meth:`start` and :meth:`stop`; guarded, with the watch, by ``_watching``
        self._started = False
        self._watching = threading.Lock()

    # -- commit notification --------------------------------------------------
    def on_commit(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after every commit in this process that created a record.

        Followers of the acceptance log (search indexer, KIP importer) register a
        cheap wake-up here (setting an event), so they follow without waiting for
        their poll interval. Commits in other processes are not seen, except over a
        store that can announce them (see :meth:`start`): elsewhere the followers'
        polling of the checkpoint is the fallback. Returns a function that removes
        the listener.
        """
        with self._watching:
            self._commit_listeners.append(listener)
            if self._started:
                self._watch()

        def remove() -> None:
            with self._watching:
                try:
                    self._commit_listeners.remove(listener)
                except ValueError:
                    pass
                if not self._commit_listeners:
                    self._unwatch_now()
        return remove

    def _committed(self, results: list[tuple[Record, bool]]) -> list[tuple[Record, bool]]:
        if self._commit_listeners and any(created for _, created in results):
            self._wake_listeners()
        return results

    def _wake_listeners(self) -> None:
        for listener in tuple(self._commit_listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001 - a wake-up must not fail a commit that is already durable
                log.warning("commit listener %r failed", listener, exc_info=True)

    def start(self) -> None:
        """Hear commits of other processes and nodes too, where the store can tell (Redis pub/sub).

        The commit listeners are then also called when any node of the deployment
        commits, so followers on this node catch up at once; polling stays their
        fallback. The subscription runs only while there is a listener: a process
        that follows nothing (``akrelay serve``'s workers, whose followers run in
        their own process; a ``--core-only`` node) would only pay for a thread woken
        by every commit of the deployment, and Redis for one more subscriber.
        Idempotent; :meth:`stop` (or :meth:`close`) stops it. Nothing starts before this.
        """
        with self._watching:
            self._started = True
            if self._commit_listeners:
                self._watch()

    def stop(self) -> None:
        """Stop what :meth:`start` started and keep the store open (a node that does not own the relay stops it)."""
        with self._watching:
            self._started = False
            self._unwatch_now()

    def _watch(self) -> None:
        if isinstance(self.store, Watchable) and self._unwatch is None:
            self._unwatch = self.store.watch(self._wake_listeners)

    def _unwatch_now(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    # -- acceptance (§8.1) ---------------------------------------------------
    def submit(self, raw: bytes, *, source: str = "http") -> tuple[Record, bool]:
        """Run §8.1 steps 1–7 in order; return ``(record, created)``.

        ``created`` is ``False`` for an exact resubmission, which returns the
        retained record unchanged (withheld or not). Every refusal raises and
        changes nothing. ``source`` ("http" or "sync") is for callers' logs.
        """
        existing, envelope, now = self.check(raw)
        if existing is not None:
            return existing, False
        return self._committed([self.store.commit(envelope, now)])[0]  # step 7

    def check(self, raw: bytes, *, expect_new: bool = False) -> tuple[Record | None, Envelope, int]:
        """§8.1 steps 1–6: ``(existing record or None, envelope, accepted_at)``.

        Split from :meth:`submit` so that a caller can gather admitted envelopes
        and commit them together (:meth:`commit_admitted`, step 7) without a
        thread hop per submission. An exact resubmission returns its retained
        record and needs no commit. Raises on any refusal; changes nothing.

        ``expect_new`` (the HTTP ingest path, where nearly every envelope is new)
        consults step 2 only when it changes the answer: if steps 3–6 pass, a
        retained envelope is found by the commit's unique-ID check, which returns
        the retained record unchanged (``created`` False) exactly as step 2 would;
        if one of them fails, the store is asked before refusing. Either way the
        observable result is §8.1's, without a store lookup per new envelope.
        """
        if expect_new:
            outcome = self.check_local(raw)
            return self.finish_check(outcome) if isinstance(outcome, PendingCheck) else outcome
        envelope, size = self._verify(raw)  # step 1
        existing = self.retained(envelope.id)  # step 2
        if existing is not None:
            return existing, envelope, 0
        outcome = self._local_steps(envelope, size)
        return self._store_steps(outcome) if isinstance(outcome, PendingCheck) else outcome

    def check_local(self, raw: bytes) -> tuple[None, Envelope, int] | PendingCheck:
        """:meth:`check` with ``expect_new`` as far as it goes without the store: never waits for I/O.

        An envelope without targets that passes steps 1–6 needs no lookup at all
        (``(None, envelope, accepted_at)``), so a caller on an event loop can
        run the CPU-bound checks there and hop to a thread only for a
        :class:`PendingCheck` (:meth:`finish_check`): step 5's targets, or
        step 2 after a refusal. Step 1's refusals raise here, as in :meth:`check`.
        """
        envelope, size = self._verify(raw)  # step 1
        return self._local_steps(envelope, size)

    def finish_check(self, pending: PendingCheck) -> tuple[Record | None, Envelope, int]:
        """The store lookups :meth:`check_local` left (blocking): the rest of :meth:`check` with ``expect_new``."""
        try:
            return self._store_steps(pending)
        except ProtocolError as exc:
            refusal = exc
        existing = self.retained(pending.envelope.id)  # step 2, asked only now
        if existing is not None:
            return existing, pending.envelope, 0
        raise refusal

    # Steps 3–6 are written once, in these two halves, whichever order step 2 takes
    # (first in :meth:`check`, after a refusal on the ingest path).
    def _local_steps(self, envelope: Envelope, size: int) -> tuple[None, Envelope, int] | PendingCheck:
        """Steps 3, 4 and (for an envelope without targets) 6: no store read; a refusal is held, not raised."""
        now = 0
        try:
            check_payload_rules(envelope, self.config.options)  # step 3
            now = self.clock()
            check_created_at(envelope, now, self.config.skew_ms)  # step 4
            if links(envelope):  # step 5 resolves exactly these targets in the store
                return PendingCheck(envelope, size, now)
            self._admit(envelope, size)  # step 6
        except ProtocolError as exc:
            return PendingCheck(envelope, size, now, exc)
        return None, envelope, now

    def _store_steps(self, pending: PendingCheck) -> tuple[None, Envelope, int]:
        """The held refusal, or steps 5 (targets resolved in the store, withheld ones too) and 6."""
        if pending.refusal is not None:
            raise pending.refusal
        check_targets(pending.envelope, self._resolve)  # step 5
        self._admit(pending.envelope, pending.size)  # step 6
        return None, pending.envelope, pending.accepted_at

    def _verify(self, raw: bytes) -> tuple[Envelope, int]:
        """Step 1 (and the size limit before it): the verified envelope and its size in bytes."""
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise ProtocolError("invalid_event", "an envelope must be submitted as UTF-8 JSON bytes")
        size = len(raw)
        if size > self.config.max_envelope_bytes:
            raise ProtocolError(
                "payload_too_large",
                f"envelope is {size} bytes, over this relay's limit of {self.config.max_envelope_bytes} bytes",
                {"limit": "max_envelope_bytes", "max": self.config.max_envelope_bytes, "actual": size},
            )
        return verify_envelope(raw if type(raw) is bytes else bytes(raw), options=self.config.options), size

    def commit_admitted(self, items: Sequence[tuple[Envelope, int]]) -> list[tuple[Record, bool]]:
        """Step 7 for envelopes that passed :meth:`check`, in one transaction, in order.

        Each acceptance gets the next ``seq`` at the store's serialized commit
        point; an ID committed meanwhile (another worker) returns its record and
        ``False``, exactly as :meth:`submit` would.
        """
        return self._committed(self.store.commit_many(items))

    def try_commit_admitted(self, items: Sequence[tuple[Envelope, int]]) -> list[tuple[Record, bool]] | None:
        """:meth:`commit_admitted` if no other writer holds the commit point, else ``None`` (nothing done)."""
        results = self.store.try_commit_many(items)
        return results if results is None else self._committed(results)

    def retained(self, event_id: str) -> Record | None:
        """Step 2's lookup: the retained record for ``event_id`` (withheld included), or ``None``.

        The ingest path also asks it when a commit fails after
        ``check(expect_new=True)``, so an exact resubmission is still answered.
        """
        return self.store.get(event_id)

    def _resolve(self, event_id: str) -> Envelope | None:
        record = self.store.get(event_id)
        return record.envelope if record is not None else None

    def _admit(self, envelope: Envelope, size: int) -> None:
        """Local admission policy: refusals are distinguishable from invalidity."""
        allow = self.config.licence_allowlist
        licence = envelope.payload.get("license")
        # A legacy retraction without a licence carries no licensed content; it is
        # admitted so that withdrawals propagate (Knowledge §7.1).
        if allow is not None and licence is not None and licence not in allow:
            raise ProtocolError(
                "permission_denied",
                f"this relay does not accept content under the licence {licence}",
                {"license": licence},
            )
        check_limits(envelope, self._limits, envelope_bytes=size)

    # -- lookup (§9.1) ---------------------------------------------------------
    def get(self, event_id: str) -> Record:
        """One visible record; ``invalid_request`` if malformed, ``not_found`` if absent or withheld."""
        self._check_id(event_id)
        record = self.store.get(event_id)
        if record is None or record.withheld:
            raise ProtocolError("not_found", f"event {event_id} is not available here")
        return record

    @staticmethod
    def _check_id(event_id: object) -> None:
        b64decode_canonical(event_id, length=32, code="invalid_request", what="event ID")

    # -- query (§9.3) ----------------------------------------------------------
    def query(self, pairs: Sequence[tuple[str, str]]) -> QueryPage:
        """One page of the complete, ``seq``-ordered enumeration.

        The first page captures the checkpoint and ``as_of``; later pages take
        both, and the last returned ``seq``, from the authenticated cursor, which
        is bound to the normalized request (``QueryRequest.binding()``).
        """
        request = parse_query(list(pairs))
        binding = request.binding()
        if request.cursor is not None:
            state = self._cursors.decode(request.cursor, binding, current_checkpoint=self.store.checkpoint())
            checkpoint, as_of, last_seq = state.checkpoint, state.as_of, state.last_seq
        else:
            checkpoint = self.store.checkpoint()
            as_of = self.clock()
            if request.after_seq > checkpoint:
                raise ProtocolError(
                    "invalid_request",
                    f"after_seq {request.after_seq} is greater than the current checkpoint {checkpoint}",
                    {"checkpoint": checkpoint},
                )
            last_seq = request.after_seq
        limit = request.limit
        records = self.store.query(
            request_terms(request),
            request.created_from,
            request.created_before,
            request.q or (),
            after_seq=last_seq,
            upto_seq=checkpoint,
            limit=limit + 1,
        )
        next_cursor = None
        if len(records) > limit:
            records = records[:limit]
            next_cursor = self._cursors.encode(binding, CursorState(checkpoint, as_of, records[-1].seq))
        return QueryPage(records, self.config.origin, checkpoint, as_of, next_cursor)

    # -- batch (§9.4) ----------------------------------------------------------
    def batch(self, raw_body: bytes) -> BatchPage:
        """Read up to 100 exact IDs; withheld, absent and later records go to ``missing``."""
        ids = parse_batch_request(parse_read_json(raw_body))
        checkpoint = self.store.checkpoint()
        as_of = self.clock()
        found = self.store.get_many(ids)
        records: list[Record] = []
        missing: list[str] = []
        for event_id in ids:
            record = found.get(event_id)
            if record is None or record.withheld or record.seq > checkpoint:
                missing.append(event_id)
            else:
                records.append(record)
        return BatchPage(records, missing, self.config.origin, checkpoint, as_of)

    # -- withholding (§7.1) --------------------------------------------------
    def withhold(self, event_id: str) -> Record:
        """Hide a retained record from public reads without deleting it."""
        return self._set_withheld(event_id, True)

    def unwithhold(self, event_id: str) -> Record:
        """Make a withheld record public again; it keeps its original ``seq``."""
        return self._set_withheld(event_id, False)

    def _set_withheld(self, event_id: str, withheld: bool) -> Record:
        self._check_id(event_id)
        if not self.store.set_withheld(event_id, withheld):
            raise ProtocolError("not_found", f"event {event_id} is not retained here")
        record = self.store.get(event_id)
        assert record is not None
        return record

    # -- discovery (§9.2) ------------------------------------------------------
    def discovery(self) -> dict[str, object]:
        """The §9.2 document: endpoints on the origin, published limits, peer hints."""
        cfg = self.config
        paths = {"events": cfg.events_path, "query": cfg.query_path, "batch": cfg.batch_path}
        if "ranked-search" in cfg.features:
            paths["search"] = cfg.search_path
        return dict(build_discovery(
            cfg.origin,
            features=cfg.features,
            search_modes=cfg.search_modes,
            peers=cfg.peers,
            limits=self._limits.to_discovery(),
            endpoints={name: cfg.origin + path for name, path in paths.items()},
        ))

    def discovery_json(self) -> bytes:
        return _json(self.discovery())

    def checkpoint(self) -> int:
        return self.store.checkpoint()

    def close(self) -> None:
        self.stop()
        self.store.close()


CURSOR_SECRET_KEY = "relay.cursor_secret"


def open_relay(
    data_dir: str | os.PathLike[str],
    config: RelayConfig | None = None,
    *,
    clock: Callable[[], int] = ms_clock,
    synchronous: str = "NORMAL",
    text_indexer: bool = True,
    merkle_log: bool = True,
) -> Relay:
    """Open the embedded relay in ``data_dir`` (created if needed).

    The cursor secret is generated once and kept in the store's metadata, so
    every worker process and every restart accepts the same cursors. With
    ``text_indexer`` a background thread keeps the trigram index caught up
    (queries are exact either way; it only makes ``q`` fast).
    """
    from akrelay.store.sqlite import SqliteStore

    store = SqliteStore(
        Path(data_dir) / "relay.sqlite3",
        synchronous=synchronous,
        text_indexer=text_indexer,
        background_checkpoint=text_indexer,
        merkle_log=merkle_log,
    )
    return _relay_over(store, config, clock, None)


def open_shared_relay(
    url: str,
    config: RelayConfig | None = None,
    *,
    namespace: str = "akrelay",
    accept_weak_durability: bool = False,
    clock: Callable[[], int] = ms_clock,
    data_dir: str | os.PathLike[str] | None = None,
    client: redis.Redis | None = None,
) -> Relay:
    """Open the relay over the acceptance log shared in Redis at ``url`` (several nodes, one log).

    Refuses a Redis whose live persistence settings could lose an acknowledged
    acceptance (:func:`akrelay.store.redis.store.check_durability`) unless
    ``accept_weak_durability``. The cursor secret lives in the shared log's
    metadata, so a cursor issued by one node is accepted by every node.
    ``data_dir`` holds this node's derived state only (search index, KIP nexus, and the
    trigram index that finds ``q`` candidates, :mod:`akrelay.store.redis.text`).
    ``client``: the node's shared Redis client (``akrelay.backend.RedisBackend``), else a new one.
    """
    from akrelay.store.redis.store import RedisStore, check_durability
    from akrelay.store.redis.text import TEXT_INDEX_FILE

    text_index = None if data_dir is None else Path(data_dir) / TEXT_INDEX_FILE
    store = RedisStore(url, namespace=namespace, text_index=text_index, client=client)
    try:
        check_durability(store, accept_weak=accept_weak_durability)
        return _relay_over(store, config, clock, data_dir)
    except BaseException:
        store.close()
        raise


def _relay_over(store: Store, config: RelayConfig | None, clock: Callable[[], int],
                data_dir: str | os.PathLike[str] | None) -> Relay:
    secret = store.meta_setdefault(CURSOR_SECRET_KEY, os.urandom(32))
    return Relay(store, config, clock=clock, cursor_secret=secret, data_dir=data_dir)
