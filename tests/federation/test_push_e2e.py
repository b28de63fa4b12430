"""A pushed peer and a polled peer of the same relay converge to the same set (real relays over TLS).

``b`` subscribes to ``a``'s push stream and polls it only once an hour, so every
event that reaches ``b`` after its first pass came through an announcement;
``c`` never subscribes (``--no-push``) and polls ``a`` every 0.3 s.
"""

from __future__ import annotations

import signal

import pytest

from akrelay.cli import main
from akrelay.tls import ensure_self_signed

from .conftest import Author
from .test_mesh_e2e import Node, free_port, peer_status, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def trio(tmp_path):
    nodes = {}
    for name in ("a", "b", "c"):
        data = tmp_path / name
        node = Node(name, data, free_port(), tmp_path / f"{name}-peers.toml", tmp_path / f"{name}.log")
        ensure_self_signed(data, node.origin)
        nodes[name] = node
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    assert main(["peers", "--file", str(a.peers), "add", b.origin, "--disabled"]) == 0
    assert main(["peers", "--file", str(b.peers), "add", a.origin, "--ca-file", str(a.cert), "--allow-private",
                 "--interval", "3600"]) == 0
    assert main(["peers", "--file", str(c.peers), "add", a.origin, "--ca-file", str(a.cert), "--allow-private",
                 "--interval", "0.3", "--no-push"]) == 0
    try:
        for node in (a, b, c):
            node.start()
        yield a, b, c
    finally:
        for node in (a, b, c):
            node.kill(signal.SIGKILL)


def test_pushed_and_polled_peers_converge(trio) -> None:
    a, b, c = trio
    author = Author("pushed")
    first = author.publish("Before anyone subscribed")
    a.submit(first)
    wait_for(lambda: [row.get("push") for row in peer_status(b)] == ["pushed"], what="b subscribed to a's stream")
    wait_for(lambda: [row.get("push") for row in peer_status(c)] == ["polled (push = false in the peer file)"],
             what="c polls a")
    later = [author.publish(f"Announced {i}") for i in range(20)]
    for env in later:
        a.submit(env)
    everything = {e["hash"] for e in [first, *later]}
    wait_for(lambda: set(b.ids()) == everything, what="b has everything (its poll interval is an hour)")
    wait_for(lambda: set(c.ids()) == everything, what="c has everything")
    assert set(a.ids()) == set(b.ids()) == set(c.ids())
    (row,) = peer_status(b)
    assert row["push"] == "pushed" and row["counts"]["accepted"] == 21 and row["counts"]["rejected"] == 0
