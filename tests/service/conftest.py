"""Relays over each backend (memory, SQLite, a real Redis), with a clock the tests move by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from akrelay.service.config import ServiceConfig
from akrelay.service.relay import Relay
from akrelay.store.memory import MemoryStore
from akrelay.store.sqlite import SqliteStore
from service.support import SECRET, SERVICE, Clock


@pytest.fixture(params=["memory", "sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    """A factory of fresh stores of one backend (Redis: a fresh namespace of a real server's flushed DB)."""
    counter = iter(range(10**6))
    if request.param == "memory":
        return MemoryStore
    if request.param == "redis":
        from akrelay.store.redis import RedisStore

        url = request.getfixturevalue("redis_url")
        return lambda: RedisStore(url, namespace=f"relay-{next(counter)}")
    return lambda: SqliteStore(tmp_path / f"relay-{next(counter)}.sqlite3")


@pytest.fixture
def make_relay(backend: Callable[[], Any]) -> Any:
    opened: list[Relay] = []

    def make(clock: Clock | None = None, **config: Any) -> Relay:
        cfg = ServiceConfig(origin=config.pop("origin", SERVICE), **config)
        relay = Relay(backend(), cfg, clock=clock or Clock(), cursor_secret=SECRET)
        opened.append(relay)
        return relay

    yield make
    for relay in opened:
        relay.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def relay(make_relay: Any, clock: Clock) -> Relay:
    return make_relay(clock)
