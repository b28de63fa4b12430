"""The one list of store backends every contract suite runs over (issue 25).

The log store contract (``tests/store/test_store_contract.py``), the service suite
(``tests/relay``), the HTTP vectors, the KnowQL turn store and the federation state
all take their backends from :data:`BACKENDS` through :func:`params`, and open them
through :class:`Opener`. A third backend is one entry here and its branch in each
opener below; no suite names a backend of its own.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

import pytest

#: Every backend: in memory (tests, tools), the embedded SQLite file, the shared Redis log.
BACKENDS: tuple[str, ...] = ("memory", "sqlite", "redis")
#: Backends whose data survive a close (a reopen finds them).
DURABLE: frozenset[str] = frozenset({"sqlite", "redis"})


def params(*, without: tuple[str, ...] = ()) -> list[str]:
    """The backends of :data:`BACKENDS` a suite runs over (``without``: what it has no such store for)."""
    unknown = set(without) - set(BACKENDS)
    assert not unknown, f"no such backends: {unknown}"
    return [name for name in BACKENDS if name not in without]


class Opener:
    """Opens stores of one backend for one test (Redis: the test's flushed database of a real server)."""

    def __init__(self, name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.name = name
        self.tmp_path = tmp_path
        self.durable = name in DURABLE
        self.redis_url: str | None = str(request.getfixturevalue("redis_url")) if name == "redis" else None
        self._fresh = itertools.count()

    def log_store(self, same: bool = False) -> Any:
        """A fresh, empty log store; ``same=True``: the one store of this test, reopened on each call."""
        if self.name == "memory":
            from akrelay.store.memory import MemoryStore

            return MemoryStore()
        if self.name == "sqlite":
            from akrelay.store.sqlite import SqliteStore

            path = self.tmp_path / ("relay.sqlite3" if same else f"fresh-{next(self._fresh)}.sqlite3")
            return SqliteStore(path)
        from akrelay.store.redis.store import RedisStore

        assert self.redis_url is not None
        return RedisStore(self.redis_url) if same else RedisStore(self.redis_url,
                                                                   namespace=f"fresh{next(self._fresh)}")

    def log_stores(self, same: bool = False) -> Callable[[], Any]:
        return lambda: self.log_store(same)

    def turn_store(self, **kwargs: Any) -> Any:
        """A KnowQL turn store (SQLite: in memory for ``memory``, a file for ``sqlite``)."""
        if self.name == "redis":
            from akrelay.knowql.redis_store import RedisTurnStore

            assert self.redis_url is not None
            return RedisTurnStore.connect(self.redis_url, **kwargs)
        from akrelay.knowql.store import SqliteTurnStore

        return SqliteTurnStore(None if self.name == "memory" else self.tmp_path / "knowql.sqlite3", **kwargs)

