"""Relays over each backend (memory, SQLite, a real Redis), with a clock the tests move by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from backends import Opener, params
from relay.support import SECRET, SERVICE, Clock


@pytest.fixture(params=params())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    """A factory of fresh stores of one backend (Redis: a fresh namespace of a real server's flushed DB)."""
    return Opener(request.param, request, tmp_path).log_stores()


@pytest.fixture
def make_relay(backend: Callable[[], Any]) -> Any:
    opened: list[Relay] = []

    def make(clock: Clock | None = None, **config: Any) -> Relay:
        cfg = RelayConfig(origin=config.pop("origin", SERVICE), **config)
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
