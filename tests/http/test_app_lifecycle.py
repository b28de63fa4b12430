"""The app's lifecycle: the node's components start with the app and stop before the store closes.

Every component is on, over a data directory (so search, KIP and KnowQL open
files and threads), with a peer file (so the sync loop runs too).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.node import COMPONENTS, Component, RelayNode, build_components
from akrelay.settings import OPTIONS, defaults

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "tests" / "vectors" / "agent-knowledge-1.0.vectors.json").read_text("utf-8"))
JSON_HEADERS = {"content-type": "application/json"}


def _settings(tmp_path: Path):
    peers = tmp_path / "peers.toml"
    # a peer that never answers (a closed loopback port); the loop only has to run and stop
    peers.write_text('[[peer]]\norigin = "https://127.0.0.1:9"\n', encoding="utf-8")
    return defaults(data=str(tmp_path / "data"), peers=str(peers), write_rate=0.0, read_rate=0.0)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _exercise(client: TestClient) -> None:
    """Touch every component: submit, search, KIP, KnowQL."""
    envelope = VECTORS["fixtures"]["original"]["envelope"]
    assert client.post("/v1/knowledge/events", content=json.dumps(envelope), headers=JSON_HEADERS).status_code == 200
    assert client.post("/v1/knowledge/search", content=json.dumps({"text": "x", "mode": "lexical"}),
                       headers=JSON_HEADERS).status_code == 200
    kip = {"kip": "2.0", "operations": [{"command": "DESCRIBE SNAPSHOT"}]}
    assert client.post("/v1/kip", content=json.dumps(kip), headers=JSON_HEADERS).status_code == 200
    ask = {"ask": "what was published?", "scope": ["knowledge"], "retrieval_only": True}
    assert client.post("/query", content=json.dumps(ask), headers=JSON_HEADERS).status_code == 200
    assert client.get("/models").status_code == 200


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count open files")
def test_starting_and_stopping_the_app_repeatedly_leaks_no_thread_and_no_file(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    baseline: tuple[set[str], int] | None = None
    for _ in range(5):
        app = create_app(settings)
        with TestClient(app, raise_server_exceptions=False) as client:
            names = {t.name for t in threading.enumerate()}
            assert {"akrelay-search-indexer", "akrelay-sync"} <= names, names
            _exercise(client)
        leftover = [t.name for t in threading.enumerate() if t.name.startswith("akrelay")]
        assert leftover == []
        # AnyIO keeps idle workers of its own thread pool (shared by the process) for a while
        state = ({t.name for t in threading.enumerate() if t.name != "AnyIO worker thread"}, _open_fds())
        if baseline is None:
            baseline = state  # the first round may load libraries and caches for good
        else:
            assert state[0] <= baseline[0]
            assert state[1] <= baseline[1], f"open files grew from {baseline[1]} to {state[1]}"


def test_the_search_indexer_stops_before_the_app_closes_its_store(tmp_path: Path) -> None:
    """Else its next step reads a closed store and logs a traceback at every shutdown."""
    app = create_app(defaults(data=str(tmp_path / "data")))
    relay = app.state.relay
    with TestClient(app):
        service = app.state.node.search.engine
        indexer = service._indexer
        assert indexer is not None and indexer.is_alive()
        closed_store: list[bool] = []
        close = relay.store.close

        def close_and_check() -> None:  # the indexer must already be stopped when the store closes
            closed_store.append(not indexer.is_alive() and service._closed.is_set())
            close()

        relay.store.close = close_and_check
    assert closed_store == [True]


def test_components_stop_in_reverse_order_and_a_failing_stop_does_not_stop_the_others(tmp_path: Path) -> None:
    events: list[str] = []

    class Probe:
        options = ()

        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        def routes(self):
            return []

        def discovery(self):
            return {}

        def start(self) -> None:
            events.append("start " + self.name)

        def stop(self) -> None:
            events.append("stop " + self.name)
            if self.fail:
                raise RuntimeError("boom")

    node = RelayNode.open(defaults(data=str(tmp_path / "data")), components=(),
                          extra=[Probe("a"), Probe("b", fail=True), Probe("c")])
    with node:
        pass
    assert events == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]
    node.stop()  # idempotent
    assert len(events) == 6


def test_components_are_listed_statically_and_declare_known_options(tmp_path: Path) -> None:
    node = RelayNode.open(defaults(data=str(tmp_path / "data")), components=COMPONENTS)
    try:
        assert [c.name for c in node.components] == list(COMPONENTS)
        for component in node.components:
            assert isinstance(component, Component)
            assert set(component.options) <= set(OPTIONS), component.name
    finally:
        node.stop()
    with pytest.raises(ValueError, match="unknown relay components: nope"):
        build_components(None, defaults(), ("nope",))
    with pytest.raises(ValueError, match="knowql"):
        build_components(None, defaults(), ("knowql",))


def test_importing_and_mounting_starts_nothing(tmp_path: Path) -> None:
    before = {t.name for t in threading.enumerate()}
    app = create_app(defaults(data=str(tmp_path / "data")))
    started = {t.name for t in threading.enumerate()} - before
    assert not [name for name in started if name.startswith("akrelay-") and name != "akrelay-text-index"
                and name != "akrelay-checkpoint"], started
    app.state.node.stop()


def test_the_followers_report_their_durable_position(tmp_path: Path) -> None:
    app = create_app(defaults(data=str(tmp_path / "data"), write_rate=0.0, read_rate=0.0))
    node = app.state.node
    with TestClient(app) as client:
        envelope = VECTORS["fixtures"]["original"]["envelope"]
        answer = client.post("/v1/knowledge/events", content=json.dumps(envelope), headers=JSON_HEADERS)
        assert answer.status_code == 200
        indexer = node.search.engine._indexer
        deadline = time.monotonic() + 60
        while indexer.position() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert indexer.position() == 1
        node.kip.gateway.runtime()  # caught up for a request
        assert node.kip.gateway._follower.position() == 1
