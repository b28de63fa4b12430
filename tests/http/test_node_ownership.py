"""Issue 25, the owner: one backend chosen once, only ``start()`` starts, requests never (re)open a service.

Every component is on, over a data directory (SQLite) or a Redis log, with a peer
file so the sync loop runs too. Between ``RelayNode.open`` and ``start()`` no
``akrelay-*`` thread exists, and none is left after ``stop()``; every thread that
``start()`` adds is named ``akrelay-...``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from litestar import get
from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.backend import BACKENDS, RedisBackend, SqliteBackend, backend_for
from akrelay.http.lifecycle import NotRunning
from akrelay.components.search import SearchComponent
from akrelay.node import REGISTRY, ComponentSpec, RelayNode
from akrelay.settings import defaults

JSON_HEADERS = {"content-type": "application/json"}
PREFIX = "akrelay-"


def _settings(tmp_path: Path, store: str = "", **extra: Any):
    peers = tmp_path / "peers.toml"
    # a peer that never answers (a closed loopback port); the loop only has to run and stop
    peers.write_text('[[peer]]\norigin = "https://127.0.0.1:9"\n', encoding="utf-8")
    options: dict[str, Any] = dict(data=str(tmp_path / "data"), peers=str(peers), store=store, write_rate=0.0,
                                   read_rate=0.0)
    options.update(extra)
    return defaults(**options)


def _ours(before: frozenset[int] = frozenset()) -> set[str]:
    """Our threads (``akrelay-*``) alive now, but for those in ``before`` (other tests' leftovers)."""
    return {t.name for t in threading.enumerate() if t.name.startswith(PREFIX) and t.ident not in before}


def _idents() -> frozenset[int]:
    return frozenset(t.ident for t in threading.enumerate() if t.ident is not None)


def _wait_until(condition: Any, deadline: float = 30.0) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "sqlite" else str(request.getfixturevalue("redis_url"))


def test_only_start_starts_and_stop_leaves_no_thread(tmp_path: Path, store_url: str) -> None:
    before = _idents()
    node = RelayNode.open(_settings(tmp_path, store_url))
    try:
        assert _ours(before) == set()  # opening the store, the index, the nexus and the turn store started nothing
        node.start()
        added = [t for t in threading.enumerate() if t.ident not in before]
        assert {"akrelay-sync"} <= {t.name for t in added}
        assert {"akrelay-text-index", "akrelay-redis-text-indexer"} & {t.name for t in added}, added
        assert [t.name for t in added if not t.name.startswith(PREFIX)] == []  # every thread of ours is named
    finally:
        node.stop()
    assert _wait_until(lambda: not _ours(before)), _ours(before)


def test_schema_creation_starts_no_thread(tmp_path: Path, store_url: str) -> None:
    """What ``akrelay serve`` does in the launcher before the workers start (``server.prepare``)."""
    before = _idents()
    node = RelayNode.open(_settings(tmp_path, store_url), components=())
    assert _ours(before) == set()
    node.stop()
    assert _ours(before) == set()


def test_a_request_after_stop_is_503_and_reopens_nothing(tmp_path: Path) -> None:
    before = _idents()
    app = create_app(_settings(tmp_path))
    search = {"text": "x", "mode": "lexical"}
    kip = {"kip": "2.0", "operations": [{"command": "DESCRIBE SNAPSHOT"}]}
    ask = {"ask": "what was published?", "scope": ["knowledge"], "retrieval_only": True}
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v1/knowledge/search", content=json.dumps(search), headers=JSON_HEADERS).status_code == 200
    assert _wait_until(lambda: not _ours(before)), _ours(before)
    # The app (its routes) outlives the node's stop: a late request must not open a service again.
    client = TestClient(app, raise_server_exceptions=False)
    for path, body in (("/v1/knowledge/search", search), ("/v1/kip", kip), ("/query", ask)):
        response = client.request("POST", path, content=json.dumps(body), headers=JSON_HEADERS)
        assert response.status_code == 503, (path, response.text)
        assert "not running" in response.text and response.headers["retry-after"] == "1"
    assert _ours(before) == set()
    node = app.state.node
    with pytest.raises(NotRunning):
        node.search.engine  # noqa: B018
    with pytest.raises(NotRunning):
        node.kip.gateway.runtime()


def test_a_request_before_start_is_503(tmp_path: Path) -> None:
    before = _idents()
    node = RelayNode.open(_settings(tmp_path), components=("search",))
    try:
        with pytest.raises(NotRunning):
            node.search.engine  # noqa: B018
        assert _ours(before) == set()
    finally:
        node.stop()


# -- one registry of components -------------------------------------------------------------------

class Toy:
    """A sixth component: one route, one discovery member, and a record of its lifecycle."""

    name = "toy"
    options: tuple[str, ...] = ()
    events: list[str] = []

    def __init__(self, search: SearchComponent | None) -> None:
        self.search = search

    def routes(self) -> list[Any]:
        @get("/toy", sync_to_thread=False)
        def toy() -> dict[str, Any]:
            return {"toy": True, "search": self.search is not None}

        return [toy]

    def discovery(self) -> dict[str, Any]:
        return {"features": ["toy"], "toy": {"version": 1}}

    def start(self) -> None:
        assert self.search is not None and self.search._engine is not None  # started after search  # noqa: SLF001
        Toy.events.append("start")

    def stop(self) -> None:
        Toy.events.append("stop")


def test_a_sixth_component_is_one_registry_entry(tmp_path: Path) -> None:
    registry = REGISTRY.with_component(ComponentSpec("toy", lambda a: Toy(a.get("search", SearchComponent))),
                                       after="search")
    assert registry.names[:3] == ("log", "search", "toy")
    Toy.events.clear()
    node = RelayNode.open(_settings(tmp_path, peers=""), registry=registry, components=("search", "toy"))
    app = create_app(node)
    with TestClient(app) as client:
        assert Toy.events == ["start"]
        assert client.get("/toy").json() == {"toy": True, "search": True}
        doc = client.get("/.well-known/agent-knowledge").json()
        assert "toy" in doc["features"] and doc["toy"] == {"version": 1}
    assert Toy.events == ["start", "stop"]
    assert isinstance(node.component("toy", Toy), Toy)
    with pytest.raises(ValueError, match="unknown relay components: toy"):
        RelayNode.open(_settings(tmp_path), components=("toy",))


def test_component_is_typed(tmp_path: Path) -> None:
    node = RelayNode.open(_settings(tmp_path), components=("search",))
    try:
        assert isinstance(node.component("search", SearchComponent), SearchComponent)
        with pytest.raises(TypeError, match="'search' component is a SearchComponent, not a Toy"):
            node.component("search", Toy)
        with pytest.raises(KeyError, match="no 'kip' component"):
            node.component("kip", SearchComponent)
    finally:
        node.stop()


# -- one backend, chosen once -----------------------------------------------------------------------

def test_the_store_url_scheme_picks_the_backend(tmp_path: Path) -> None:
    assert type(backend_for(defaults(data=str(tmp_path)))) is SqliteBackend
    for url in ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "unix:///tmp/redis.sock"):
        backend = backend_for(defaults(data=str(tmp_path), store=url))
        assert type(backend) is RedisBackend and backend.shared
        backend.close()
    assert set(BACKENDS) == {"", "sqlite", "redis", "rediss", "unix"}


def test_one_redis_client_serves_the_node(tmp_path: Path, redis_url: str) -> None:
    """The log, the turn store and the sync lease share the backend's client (the limiter has its own)."""
    node = RelayNode.open(_settings(tmp_path, redis_url))
    try:
        client = node.backend.client
        assert node.relay.store._client is client  # noqa: SLF001
        node.start()
        assert node.knowql.engine.store._r is client  # noqa: SLF001
        assert node.sync._loop is not None and node.sync._loop.leadership.lock.client is client  # noqa: SLF001
    finally:
        node.stop()


class MemoryBackend(SqliteBackend):
    """A third backend: the log in memory (the rest as SQLite's, in memory where it can be)."""

    schemes = ("mem",)
    label = "memory"

    def open_relay(self) -> Any:
        from akrelay.backend import relay_config
        from akrelay.relay.core import Relay
        from akrelay.store.memory import MemoryStore

        return Relay(MemoryStore(), relay_config(self.settings), cursor_secret=b"k" * 32)


def test_a_third_backend_is_one_registry_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "mem", MemoryBackend)
    before = _idents()
    node = RelayNode.open(_settings(tmp_path, "mem://", peers=""))
    app = create_app(node)
    with TestClient(app) as client:
        assert type(node.backend) is MemoryBackend and node.relay.data_dir is None
        search = {"text": "x", "mode": "lexical"}
        assert client.post("/v1/knowledge/search", content=json.dumps(search), headers=JSON_HEADERS).status_code == 200
        ask = {"ask": "what was published?", "scope": ["knowledge"], "retrieval_only": True}
        assert client.post("/query", content=json.dumps(ask), headers=JSON_HEADERS).status_code == 200
    assert _wait_until(lambda: not _ours(before)), _ours(before)


def test_the_log_key_is_read_when_the_node_opens_and_a_built_component_touches_no_file(tmp_path: Path) -> None:
    from akrelay.components.log import LogComponent
    from akrelay.relay.transparency import KEY_NAME

    settings = _settings(tmp_path)
    relay = backend_for(settings).open_relay()
    try:
        assert relay.data_dir is not None
        key_file = relay.data_dir / KEY_NAME
        bare = LogComponent(relay, settings, None)
        assert not key_file.exists() and bare.routes() == [] and bare.discovery() == {}
        opened = LogComponent.open(relay, settings)
        assert key_file.exists() and opened.tlog is not None and opened.routes()
        again = LogComponent.open(relay, settings)  # the same key, read back
        assert again.tlog is not None and again.tlog.vkey == opened.tlog.vkey
    finally:
        relay.close()
    (tmp_path / "second").mkdir()
    node = RelayNode.open(_settings(tmp_path / "second"), components=("log",))
    try:  # the node's open is where the key is made: before start, with no thread
        assert node.relay.data_dir is not None and (node.relay.data_dir / KEY_NAME).exists()
    finally:
        node.stop()
