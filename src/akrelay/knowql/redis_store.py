"""The KnowQL turn store in Redis: sessions and queries shared by every node of a deployment.

Same interface and semantics as :class:`akrelay.knowql.store.SqliteTurnStore`, so a
poll, a cancel, an event replay or the next turn of a session can reach any worker of
any node. Each change is one optimistic transaction (``WATCH`` the keys it decides on,
then ``MULTI``/``EXEC``, retried when another writer got there first): a status change
is a compare-and-set from ``in_progress``, made together with its terminal event and
the release of the session's in-flight slot; progress events are only appended while
the turn is still in progress, so the terminal event is always a stream's last.

Keys (``<p>`` is :data:`KEY_PREFIX`, ``akrelay:knowql:``):

* ``<p>session:<id>`` hash: ``doc`` (JSON), ``last`` and ``inflight`` (query ids, ``""`` for none),
  ``created``, ``updated`` (RFC 3339);
* ``<p>session-queries:<id>`` list: the session's query ids in order;
* ``<p>query:<id>`` hash: ``session``, ``status``, ``deadline``, ``doc`` (JSON);
* ``<p>events:<id>`` list: the query's events (JSON); an event's ``seq`` is its position from 1;
* ``<p>status-counts`` hash: turns per status, for ``/metrics``.

Nothing expires by time, as in the SQLite file: a session lives until it is deleted.
A Redis outage is :class:`~akrelay.store.base.StoreUnavailable` (503 with ``Retry-After``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Generic, Sequence, TypeVar

import redis
import redis.client
import redis.exceptions

from akrelay.knowql.errors import conflict, not_found
from akrelay.knowql import lifecycle
from akrelay.knowql.documents import Event, NewSession, QueryDoc, QueryFields, SessionDoc
from akrelay.knowql.lifecycle import TERMINAL, dump as _dump, rfc3339
from akrelay.knowql.wakeup import Wakeups
from akrelay.store.redis.client import connect, unavailable

_T = TypeVar("_T")

KEY_PREFIX = "akrelay:knowql:"
#: Optimistic transactions retried at most this often before the request is refused as busy.
MAX_RETRIES = 64

#: Methods wrapped in this answer a Redis outage as StoreUnavailable (503 with Retry-After upstream).
log = logging.getLogger("akrelay.knowql")
_outage_is_503 = unavailable("the KnowQL session store (Redis)")



def _text(value: bytes | str | None) -> str | None:
    return _str(value) if value is not None else None


def _str(value: bytes | str) -> str:
    """A reply as text: redis-py types replies ``bytes | str`` (this client's are bytes: no decode_responses)."""
    return value.decode() if isinstance(value, bytes) else value


class RedisTurnStore:
    """:class:`~akrelay.knowql.store.TurnStore` in the Redis at ``url`` (or over ``client``)."""

    def __init__(self, client: redis.Redis, *, clock: Callable[[], float] = time.time,
                 prefix: str = KEY_PREFIX, owns_client: bool = True) -> None:
        """``owns_client=False``: ``client`` is the node's shared one (its backend closes it), not closed here."""
        self._r = client
        self._owns_client = owns_client
        self.clock = clock
        self.prefix = prefix
        #: every change is published on ``<p>wake`` (the query id); tails of every node wake on it
        self.wakeups = _RedisWakeups(client, f"{prefix}wake")

    @classmethod
    def connect(cls, url: str, *, clock: Callable[[], float] = time.time, prefix: str = KEY_PREFIX) -> "RedisTurnStore":
        """A store over a new client for ``url`` (connected on first use, closed by :meth:`close`)."""
        return cls(connect(url), clock=clock, prefix=prefix)

    def close(self) -> None:
        self.wakeups.stop()
        if self._owns_client:
            self._r.close()

    @property
    def _wake(self) -> str:
        return f"{self.prefix}wake"

    @property
    def _running(self) -> str:
        """The set of query ids in progress (added with the turn, removed with its terminal state)."""
        return f"{self.prefix}in-progress"

    @_outage_is_503
    def in_progress(self, limit: int) -> list[QueryDoc]:
        """Up to ``limit`` stored documents of turns still ``in_progress``."""
        out: list[QueryDoc] = []
        for qid in list(self._r.sscan_iter(self._running, count=256))[:limit]:
            status, doc = self._r.hmget(self._query(qid.decode()), "status", "doc")
            if status == b"in_progress" and doc is not None:
                out.append(json.loads(doc))
            elif status is None or status != b"in_progress":
                self._r.srem(self._running, qid)  # its query was deleted or ended: forget it
        return out

    # ---- keys -------------------------------------------------------------------------------

    def _session(self, session_id: str) -> str:
        return f"{self.prefix}session:{session_id}"

    def _queries(self, session_id: str) -> str:
        return f"{self.prefix}session-queries:{session_id}"

    def _query(self, query_id: str) -> str:
        return f"{self.prefix}query:{query_id}"

    def _events(self, query_id: str) -> str:
        return f"{self.prefix}events:{query_id}"

    @property
    def _counts(self) -> str:
        return f"{self.prefix}status-counts"

    def _transaction(self, watch: list[str], body: Callable[[redis.client.Pipeline], _T | _FromReplies[_T]]) -> _T:
        """Run ``body`` on a pipeline watching ``watch``, again while another writer interferes.

        ``body`` reads in immediate mode (it may watch more keys), then calls ``pipe.multi()``
        and queues its writes. It returns the result, or (:class:`_FromReplies`) how the
        result is read from the writes' replies.
        """
        for _ in range(MAX_RETRIES):
            with self._r.pipeline() as pipe:
                try:
                    pipe.watch(*watch)  # type: ignore[no-untyped-call]  # redis-py leaves Pipeline.watch untyped
                    result = body(pipe)
                    if isinstance(result, _FromReplies):  # returned after pipe.multi(), as its writes need
                        return result.read(pipe.execute())
                    if pipe.explicit_transaction:
                        pipe.execute()
                    return result
                except redis.exceptions.WatchError:
                    continue
        raise conflict("session_busy", "the session changed too often to record this; retry")

    # ---- turns ------------------------------------------------------------------------------

    @_outage_is_503
    def create_turn(self, session: NewSession | None, session_id: str, query: QueryDoc,
                    deadline: float) -> tuple[SessionDoc, QueryDoc]:
        """Record ``query`` (in_progress) in a new ``session`` or the existing ``session_id``.

        Takes the session's in-flight slot (409 ``session_busy`` if another turn holds
        it) and links the query after the session's last one; nothing is written when it refuses.
        """
        now = self.clock()
        self._expire_session(session_id, now)
        skey = self._session(session_id)
        stamp = rfc3339(now)

        def body(pipe: redis.client.Pipeline) -> tuple[SessionDoc, QueryDoc]:
            doc_text, last, inflight, created = pipe.hmget(skey, "doc", "last", "inflight", "created")
            if session is not None:
                if doc_text is not None:
                    raise conflict("session_exists", f"a session {session_id!r} exists already")
                stored: NewSession = session
                last, created = None, stamp.encode()
            elif doc_text is None:
                raise not_found("session_not_found", f"no session {session_id!r}")
            else:
                if inflight:
                    raise conflict("session_busy", f"query {_str(inflight)} is still in progress on this session")
                stored = json.loads(doc_text)
            previous = _str(last) if last else None
            doc = query.copy()
            doc["session_id"], doc["previous_query_id"] = session_id, previous
            pipe.multi()
            if session is not None:
                pipe.hset(skey, mapping={"doc": _dump(session), "created": stamp})
            pipe.hset(skey, mapping={"last": doc["id"], "inflight": doc["id"], "updated": stamp})
            pipe.rpush(self._queries(session_id), doc["id"])
            pipe.hset(self._query(doc["id"]), mapping={
                "session": session_id, "status": "in_progress", "deadline": repr(float(deadline)), "doc": _dump(doc)})
            pipe.hincrby(self._counts, "in_progress", 1)
            pipe.sadd(self._running, doc["id"])
            session_doc: SessionDoc = {**stored, "last_query_id": doc["id"], "created_at": _text(created),
                                       "updated_at": stamp}
            return session_doc, doc

        return self._transaction([skey], body)

    def _expire_session(self, session_id: str, now: float) -> None:
        inflight = self._r.hget(self._session(session_id), "inflight")
        if inflight:
            self.get_query(_str(inflight), now=now)

    @_outage_is_503
    def status_counts(self) -> dict[str, int]:
        """Turns per status (``/metrics``): one count for every node of the deployment."""
        return {_str(k): int(v) for k, v in self._r.hgetall(self._counts).items() if int(v) > 0}

    @_outage_is_503
    def get_query(self, query_id: str, *, now: float | None = None) -> QueryDoc | None:
        status, deadline, doc = self._r.hmget(self._query(query_id), "status", "deadline", "doc")
        if doc is None:
            return None
        now = self.clock() if now is None else now
        if lifecycle.expired(_text(status), float(deadline or 0), now):
            self.finish(query_id, "failed", *lifecycle.timeout(json.loads(doc)))
            return self.get_query(query_id, now=now)
        found: QueryDoc = json.loads(doc)
        return found

    @_outage_is_503
    def finish(self, query_id: str, status: str, fields: QueryFields, event: Event | None = None,
               *, pending: Sequence[Event] = ()) -> bool:
        """Move an in_progress query to ``status`` with ``fields`` merged into its document.

        ``pending`` progress events, then ``event`` (the terminal one, ``response.<status>``
        by default), are appended in the same transaction. ``False`` when the query was no
        longer in progress (nothing is written).
        """
        assert status in TERMINAL
        now = self.clock()
        qkey = self._query(query_id)
        session_id = _text(self._r.hget(qkey, "session"))
        if session_id is None:
            return False
        skey = self._session(session_id)

        def body(pipe: redis.client.Pipeline) -> bool:
            current, doc_text = pipe.hmget(qkey, "status", "doc")
            if current != b"in_progress" or doc_text is None:
                return False
            inflight = pipe.hget(skey, "inflight")
            doc = lifecycle.finished(json.loads(doc_text), status, fields, now)
            terminal = lifecycle.terminal_event(query_id, status, event, doc)
            pipe.multi()
            pipe.hset(qkey, mapping={"status": status, "doc": _dump(doc)})
            if inflight is not None and _str(inflight) == query_id:
                pipe.hset(skey, mapping={"inflight": "", "updated": rfc3339(now)})
            events = lifecycle.progress_events(query_id, pending) + [terminal]
            pipe.rpush(self._events(query_id), *(_dump(e) for e in events))
            pipe.hincrby(self._counts, "in_progress", -1)
            pipe.hincrby(self._counts, status, 1)
            pipe.srem(self._running, query_id)
            pipe.publish(self._wake, query_id)
            return True

        done: bool = self._transaction([qkey, skey], body)
        if done:
            self.wakeups.notify(query_id)
        return done

    @_outage_is_503
    def append_events(self, query_id: str, events: Sequence[Event]) -> int | None:
        """Append progress events while the query is in progress; the last seq, or ``None`` if it ended."""
        qkey, ekey = self._query(query_id), self._events(query_id)

        def body(pipe: redis.client.Pipeline) -> int | None | _FromReplies[int | None]:
            if pipe.hget(qkey, "status") != b"in_progress":
                return None
            if not events:
                return 0
            pipe.multi()
            pipe.publish(self._wake, query_id)  # delivered after EXEC: a woken tail reads the push
            pipe.rpush(ekey, *(_dump(e) for e in lifecycle.progress_events(query_id, events)))
            return _FromReplies(_last_seq)

        last: int | None = self._transaction([qkey], body)
        if last:
            self.wakeups.notify(query_id)
        return last

    @_outage_is_503
    def events(self, query_id: str, from_seq: int = 0) -> list[tuple[int, str, Event]]:
        start = max(1, from_seq)
        out = []
        for offset, data in enumerate(self._r.lrange(self._events(query_id), start - 1, -1)):
            event: Event = json.loads(data)
            out.append((start + offset, event["type"], event))
        return out

    # ---- sessions ---------------------------------------------------------------------------

    @_outage_is_503
    def get_session(self, session_id: str) -> SessionDoc | None:
        doc_text, last, created, updated = self._r.hmget(self._session(session_id), "doc", "last", "created", "updated")
        if doc_text is None:
            return None
        doc: SessionDoc = json.loads(doc_text)
        doc["last_query_id"], doc["created_at"], doc["updated_at"] = _text(last) or None, _text(created), _text(updated)
        return doc

    @_outage_is_503
    def session_queries(self, session_id: str) -> list[QueryDoc]:
        ids = [_str(qid) for qid in self._r.lrange(self._queries(session_id), 0, -1)]
        return [q for qid in ids if (q := self.get_query(qid)) is not None]

    @_outage_is_503
    def recent_queries(self, session_id: str, limit: int) -> list[QueryDoc]:
        """The session's last ``limit`` queries, oldest first."""
        ids = [_str(qid) for qid in self._r.lrange(self._queries(session_id), -limit, -1)]
        return [q for qid in ids if (q := self.get_query(qid)) is not None]

    @_outage_is_503
    def session_page(self, session_id: str, offset: int, limit: int) -> tuple[int, list[QueryDoc]]:
        """The session's query count and ``limit`` of its queries from position ``offset`` (0-based)."""
        key = self._queries(session_id)
        total = int(self._r.llen(key))
        ids = [_str(qid) for qid in self._r.lrange(key, offset, offset + limit - 1)] if limit > 0 else []
        return total, [q for qid in ids if (q := self.get_query(qid)) is not None]

    @_outage_is_503
    def session_of_query(self, query_id: str) -> str | None:
        return _text(self._r.hget(self._query(query_id), "session"))

    @_outage_is_503
    def delete_session(self, session_id: str) -> bool:
        skey, lkey = self._session(session_id), self._queries(session_id)

        def body(pipe: redis.client.Pipeline) -> bool:
            existed = bool(pipe.exists(skey))
            ids = [_str(qid) for qid in pipe.lrange(lkey, 0, -1)]
            if ids:
                pipe.watch(*(self._query(q) for q in ids))  # type: ignore[no-untyped-call]  # untyped in redis-py; their statuses feed the counts
            statuses = [pipe.hget(self._query(qid), "status") for qid in ids]
            pipe.multi()
            pipe.delete(skey, lkey, *(self._query(q) for q in ids), *(self._events(q) for q in ids))
            for status in statuses:
                if status is not None:
                    pipe.hincrby(self._counts, _str(status), -1)
            return existed

        return self._transaction([skey, lkey], body)


class _FromReplies(Generic[_T]):
    """What a transaction's body returns when its result is read from the replies of its writes."""

    __slots__ = ("read",)

    def __init__(self, read: Callable[[list[object]], _T]) -> None:
        self.read = read


def _last_seq(replies: list[object]) -> int:
    """The reply of a body's last write, an ``RPUSH``: the list's length after the push, so the last seq."""
    length = replies[-1]
    assert isinstance(length, int)
    return length


class _RedisWakeups(Wakeups):
    """:class:`Wakeups` fed also by what every node publishes on the store's ``wake`` channel.

    One listener thread per store, started by the first tail. While Redis is away it logs
    once (no traceback) and retries with back-off; tails meanwhile fall back to their slow poll.
    """

    def __init__(self, client: redis.Redis, channel: str) -> None:
        super().__init__()
        self._client, self._channel = client, channel
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._start = threading.Lock()

    def watch(self, query_id: str) -> None:
        super().watch(query_id)
        if self._thread is None and not self._stopped.is_set():
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._listen, name="akrelay-knowql-wake", daemon=True)
                    self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)

    def _listen(self) -> None:
        backoff = 0.0
        while not self._stopped.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]  # untyped in redis-py
            try:
                pubsub.subscribe(self._channel)
                if backoff:
                    log.warning("KnowQL wake-ups: Redis is back; streams wake on events again")
                    backoff = 0.0
                while not self._stopped.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "message":
                        data = message["data"]
                        self.notify(data.decode() if isinstance(data, bytes) else str(data))
            except (redis.exceptions.RedisError, OSError) as exc:
                if not backoff:
                    log.warning("KnowQL wake-ups: Redis unreachable (%s); streams poll until it is back",
                                type(exc).__name__)
                backoff = min(8.0, backoff * 2 or 0.5)
                self._stopped.wait(backoff)
            finally:
                try:
                    pubsub.close()
                except (redis.exceptions.RedisError, OSError):
                    pass
