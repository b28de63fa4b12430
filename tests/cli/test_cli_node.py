"""Every CLI command that opens a data directory does so through the one owner, with only what it needs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from akrelay.cli import main
from akrelay.node import RelayNode
from akrelay.settings import defaults, record_origin

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "agent-knowledge-1.0.vectors.json")
                     .read_text("utf-8"))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    node = RelayNode.open(defaults(data=str(directory)), components=())
    node.stop()
    record_origin(directory, "https://relay.example.org")  # as `serve` would (reindex --kip, kip, kql need it)
    return directory


@pytest.fixture
def opened(monkeypatch) -> list[tuple[str, ...]]:
    """The component names of every node the command opened, and a check that it stopped them."""
    calls: list[tuple[str, ...]] = []
    real = RelayNode.open.__func__  # type: ignore[attr-defined]

    def recording(cls, settings, **kw):
        node = real(cls, settings, **kw)
        calls.append(tuple(c.name for c in node.components))
        return node

    monkeypatch.setattr(RelayNode, "open", classmethod(recording))
    return calls


@pytest.mark.parametrize(("argv", "components"), [
    (["reindex"], ("search",)),
    (["reindex", "--kip"], ("kip",)),
    (["kip", "DESCRIBE SNAPSHOT"], ("kip",)),
    (["kql", "FIND(?c) WHERE { ?c {type: \"Agent\"} }"], ("kip",)),
    (["withhold", "A" * 43], ()),
])
def test_commands_open_the_node_with_only_their_components(argv, components, data, opened, capsys) -> None:
    before = {t.name for t in threading.enumerate()}
    main([*argv, "--data", str(data)])
    assert opened == [components]
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [name for name in leftover if name.startswith("akrelay")], leftover


def test_sync_once_opens_the_node_with_the_sync_component(data, opened, tmp_path, capsys) -> None:
    peers = tmp_path / "peers.toml"
    peers.write_text('[[peer]]\norigin = "https://127.0.0.1:9"\n', encoding="utf-8")
    main(["sync", "--once", "--data", str(data), "--peers", str(peers)])
    assert opened == [("sync",)]
    assert "failed" in capsys.readouterr().out  # the peer is refused (a private address); the pass ran
