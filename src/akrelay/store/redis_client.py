"""One way to talk to the shared Redis: bounded timeouts, and outages as :class:`StoreUnavailable`.

Everything deployment-wide that lives in Redis (the acceptance log, rate limits, the sync
lease, KnowQL sessions) connects through :func:`connect`, so that a Redis that is down or
stalled costs a request a few seconds at most (never a hang), and becomes a 503 with
``Retry-After`` in one place (:func:`unavailable`), never a 500.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

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


class Observer:
    """Where :class:`~akrelay.store.redis.RedisStore` reports each round trip and each outage.

    The store cannot import the metrics layer (it is below it); the HTTP app points
    :data:`observer` at ``/metrics`` (``akrelay.http.app``). The default ignores them.
    """

    def call(self, name: str, seconds: float) -> None:
        """One store call ``name`` (a script name, or ``other``) answered in ``seconds``."""

    def outage(self) -> None:
        """One call failed as an outage (it becomes a 503)."""


observer = Observer()


def connect(url: str, *, reply_timeout: float = REPLY_TIMEOUT, **kwargs: Any) -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://``, ``unix://``) with bounded waits.

    The pool reconnects by itself once Redis is back; no command is retried here, so a
    write is never sent twice behind the caller's back.
    """
    options: dict[str, Any] = dict(
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=reply_timeout,
        socket_keepalive=True,
        health_check_interval=15,
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


@contextlib.contextmanager
def unavailable(what: str = "the Redis store") -> Iterator[None]:
    """Turn a Redis outage inside the block into :class:`StoreUnavailable` (503 upstream)."""
    try:
        yield
    except OUTAGE_ERRORS as exc:
        raise StoreUnavailable(f"{what} is unreachable: {exc}", RETRY_AFTER) from exc
