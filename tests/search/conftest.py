import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from akrelay.search import SearchEngine  # noqa: E402
from akrelay.relay.config import RelayConfig  # noqa: E402
from akrelay.relay.core import Relay, open_relay  # noqa: E402
from akrelay.store.memory import MemoryStore  # noqa: E402

from search_corpus import ORIGIN  # noqa: E402
NOW = 1_790_553_600_000


class Env:
    """A relay, its store and search services to be closed after the test."""

    def __init__(self) -> None:
        self.services: list[SearchEngine] = []
        self.relays: list[Relay] = []

    def memory_relay(self) -> Relay:
        relay = Relay(MemoryStore(), RelayConfig(origin=ORIGIN), clock=lambda: NOW, cursor_secret=b"k" * 32)
        self.relays.append(relay)
        return relay

    def disk_relay(self, data: Path) -> Relay:
        relay = open_relay(data, RelayConfig(origin=ORIGIN), clock=lambda: NOW)
        self.relays.append(relay)
        return relay

    def service(self, relay: Relay, data: Path | None = None, **kw) -> SearchEngine:
        service = SearchEngine(relay, data, **kw)
        self.services.append(service)
        return service

    def close(self) -> None:
        for service in self.services:
            service.close()
        for relay in self.relays:
            relay.close()


@pytest.fixture
def env():
    e = Env()
    yield e
    e.close()
