"""One way to talk to the shared Redis: bounded timeouts, and outages as :class:`StoreUnavailable`.

Everything deployment-wide that lives in Redis (the acceptance log, rate limits, the sync
lease, KnowQL sessions) connects through :func:`connect`, so that a Redis that is down or
stalled costs a request a few seconds at most (never a hang), and becomes a 503 with
``Retry-After`` in one place (:func:`unavailable`), never a 500.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Protocol

import redis
import redis.exceptions

from akrelay.store.base import StoreUnavailable

#: Seconds to connect, and to wait for any one reply. A command slower than this is an outage.
CONNECT_TIMEOUT = 2.0
REPLY_TIMEOUT = 3.0
#: What a client is told to wait before retrying while Redis is away.
RETRY_AFTER = 2

#: redis-py errors that mean "not reachable now" rather than "our bug".
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,   # includes BusyLoadingError (replaying the AOF after a restart)
    redis.exceptions.TimeoutError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,     # a replica promoted away from us / failover in progress
    redis.exceptions.MasterDownError,
    ConnectionError,
    TimeoutError,
)

#: Error replies (their first word) of a server that answers but cannot take writes now. Reads still
#: work there, so these never put a client on hold: out of memory under ``noeviction``, persistence
#: failing (a full disk), a read-only replica, too few replicas for ``min-replicas-to-write``.
REFUSAL_REPLIES = ("OOM", "MISCONF", "READONLY", "NOREPLICAS")
#: Error replies of a server that answers nothing useful now (loading, failing over, a script running).
DOWN_REPLIES = ("LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "CLUSTERDOWN")

#: What :func:`outage_kind` says: unreachable (every call fails), or refusing writes only.
DOWN = "down"
REFUSING = "refusing"

#: How redis-py prefixes an error of a command queued in a pipeline or MULTI (the reply's code follows).
_PIPELINE_MARK = " of pipeline caused error: "


def _reply_code(exc: redis.exceptions.ResponseError) -> str:
    """The error reply's code (``OOM``, ``MISCONF``...), also for the classes redis-py strips it from."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return "OOM"
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return "READONLY"
    message = str(exc)
    if _PIPELINE_MARK in message:
        message = message.split(_PIPELINE_MARK, 1)[1]
    return message.split(" ", 1)[0]


def outage_kind(exc: BaseException) -> str | None:
    """:data:`DOWN`, :data:`REFUSING`, or ``None`` when ``exc`` is not an outage (a bug, bad data).

    A full Redis (``OOM``), one that cannot persist (``MISCONF``) or a replica (``READONLY``)
    refuses writes but still serves reads: callers answer writes 503 and keep reading.
    """
    if isinstance(exc, redis.exceptions.ResponseError):
        code = _reply_code(exc)
        if code in REFUSAL_REPLIES:
            return REFUSING
        if code in DOWN_REPLIES or isinstance(exc, OUTAGE_ERRORS):
            return DOWN
        return None
    return DOWN if isinstance(exc, OUTAGE_ERRORS) else None


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means "Redis cannot serve this now" (503 upstream) rather than a bug."""
    return outage_kind(exc) is not None


def outage_reason(exc: BaseException) -> str:
    """A short reason for logs and 503 bodies: what the reply code means, without the script hash."""
    if isinstance(exc, redis.exceptions.ResponseError):
        code = _reply_code(exc)
        if code == "OOM":
            return "Redis is out of memory (maxmemory reached; writes are refused)"
        if code == "MISCONF":
            return "Redis cannot persist (MISCONF: its last save or AOF write failed; writes are refused)"
        if code == "READONLY":
            return "Redis is a read-only replica (READONLY; writes are refused)"
        if code == "NOREPLICAS":
            return "Redis has too few replicas to accept writes (NOREPLICAS)"
    return str(exc).split(" script: ", 1)[0]


class Observing(Protocol):
    """What a Redis log reports its round trips and outages to (``akrelay.observability.metrics.StoreObserver``)."""

    def call(self, name: str, seconds: float) -> None: ...

    def outage(self) -> None: ...


class Observer:
    """Where :class:`~akrelay.store.redis.store.RedisStore` reports each round trip and each outage.

    The store cannot import the metrics layer (it is below it); the node's backend sets the
    store's ``observer`` to one that counts into ``/metrics`` (``akrelay.backend``). This one ignores them.
    """

    def call(self, name: str, seconds: float) -> None:
        """One store call ``name`` (a script name, or ``other``) answered in ``seconds``."""

    def outage(self) -> None:
        """One call failed as an outage (it becomes a 503)."""



def connect(url: str, *, reply_timeout: float = REPLY_TIMEOUT, **kwargs: object) -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://``, ``unix://``) with bounded waits.

    The pool reconnects by itself once Redis is back; no command is retried here, so a
    write is never sent twice behind the caller's back. No health-check ``PING`` before a
    command either: a Redis that cannot persist answers ``PING`` with ``MISCONF`` (while it
    still serves reads), which would fail every read on a new or idle connection; a dead
    connection fails its command instead (a pub/sub subscriber asks for the check itself).
    """
    options: dict[str, object] = dict(
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=reply_timeout,
        socket_keepalive=True,
        health_check_interval=0,
        retry_on_timeout=False,
        client_name="akrelay",
    )
    options.update(kwargs)
    return redis.Redis.from_url(url, **options)


def shared_prefix(namespace: str | None, area: str) -> str:
    """Key prefix of one deployment-wide area (``sync``, ``knowql``, ``rl``): ``<namespace>:<area>:``.

    The namespace is ``--store-namespace`` (the log's own prefix), so two deployments that
    share one Redis database share no rate budget, sync lease or KnowQL session either.
    """
    return f"{namespace or 'akrelay'}:{area}:"


def describe(url: str) -> str:
    """``url`` without a password, for messages and logs."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def unavailable_error(what: str, exc: BaseException) -> StoreUnavailable:
    """The :class:`StoreUnavailable` for the outage ``exc`` of ``what`` (say it is not an outage first)."""
    if outage_kind(exc) == REFUSING:
        return StoreUnavailable(f"{what} refused the write: {outage_reason(exc)}", RETRY_AFTER)
    return StoreUnavailable(f"{what} is unreachable: {outage_reason(exc)}", RETRY_AFTER)


@contextlib.contextmanager
def unavailable(what: str = "the Redis store") -> Iterator[None]:
    """Turn a Redis outage inside the block (see :func:`outage_kind`) into :class:`StoreUnavailable` (503 upstream)."""
    try:
        yield
    except Exception as exc:
        if not is_outage(exc):
            raise
        raise unavailable_error(what, exc) from exc
