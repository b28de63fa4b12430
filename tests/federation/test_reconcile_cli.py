"""``akrelay sync --reconcile`` against a real relay over TLS on loopback (issue 26).

The peer is ``akrelay serve`` in its own process; we hold all but five of its events from
before (seeded into our data directory), so the reconciliation must fetch exactly those five.
"""

from __future__ import annotations

import json
import signal

import pytest

from akrelay.cli import main
from akrelay.tls import ensure_self_signed

from .conftest import Author
from .test_mesh_e2e import Node, free_port, peer_status, stored_ids

pytestmark = pytest.mark.slow


def seed(data, origin: str, envelopes: list[dict]) -> None:
    from akrelay.relay.config import RelayConfig
    from akrelay.relay.core import open_relay

    relay = open_relay(data, RelayConfig(origin=origin))
    try:
        for env in envelopes:
            relay.submit(json.dumps(env).encode())
    finally:
        relay.close()


def test_sync_reconcile_fetches_exactly_what_we_lack_and_reports_it(tmp_path, capsys) -> None:
    author = Author("reconciler")
    evs = [author.publish(f"Event {i}") for i in range(30)]
    peer = Node("peer", tmp_path / "peer", free_port(), tmp_path / "peer-peers.toml", tmp_path / "peer.log")
    ensure_self_signed(peer.data, peer.origin)
    peer.peers.write_text("")
    seed(peer.data, peer.origin, evs)
    ours = tmp_path / "ours"
    our_origin = f"https://127.0.0.1:{free_port()}"
    seed(ours, our_origin, evs[5:])
    peers_file = tmp_path / "ours-peers.toml"
    assert main(["peers", "--file", str(peers_file), "add", peer.origin, "--ca-file", str(peer.cert),
                 "--allow-private"]) == 0
    capsys.readouterr()
    try:
        peer.start()
        code = main(["sync", "--data", str(ours), "--origin", our_origin, "--peers", str(peers_file),
                     "--reconcile", "--peer", peer.origin])
        out, err = capsys.readouterr()
    finally:
        peer.kill(signal.SIGKILL)
    assert code == 0, (out, err)
    assert "reconciled: have 0, need 5" in out and "accepted 5" in out, out
    assert "round 1" in err  # progress
    assert set(stored_ids(ours)) == {e["hash"] for e in evs}
    status = peer_status(Node("ours", ours, 0, peers_file, tmp_path / "x.log"))
    assert "have 0, need 5" in status[0]["reconcile_note"]
    assert main(["sync", "--data", str(ours), "--peers", str(peers_file), "--reconcile",
                 "--peer", "https://unknown.example"]) == 2


def test_sync_reconcile_offers_the_peer_what_it_lacks_and_the_peer_verifies_them(tmp_path, capsys) -> None:
    """Two real relays: we hold five events the peer lacks; the peer advertises accepts_offers, so
    `sync --reconcile` submits them to its events endpoint, where they pass its own verification.
    A second run finds equal sets and offers nothing."""
    author = Author("offerer")
    evs = [author.publish(f"Event {i}") for i in range(20)]
    peer = Node("peer", tmp_path / "peer", free_port(), tmp_path / "peer-peers.toml", tmp_path / "peer.log")
    ensure_self_signed(peer.data, peer.origin)
    peer.peers.write_text("")
    seed(peer.data, peer.origin, evs[:15])
    ours = tmp_path / "ours"
    our_origin = f"https://127.0.0.1:{free_port()}"
    seed(ours, our_origin, evs)
    peers_file = tmp_path / "ours-peers.toml"
    assert main(["peers", "--file", str(peers_file), "add", peer.origin, "--ca-file", str(peer.cert),
                 "--allow-private"]) == 0
    capsys.readouterr()
    command = ["sync", "--data", str(ours), "--origin", our_origin, "--peers", str(peers_file), "--reconcile"]
    try:
        peer.start()
        first = main(command)
        out1, err1 = capsys.readouterr()
        second = main(command)
        out2, err2 = capsys.readouterr()
    finally:
        peer.kill(signal.SIGKILL)
    assert first == 0 and second == 0, (out1, err1, out2, err2)
    assert "have 5, need 0" in out1 and "offered 5: 5 stored, 0 refused" in out1, out1
    assert "have 0, need 0" in out2 and "offered" not in out2, out2
    assert set(stored_ids(peer.data)) == {e["hash"] for e in evs}
    status = peer_status(Node("ours", ours, 0, peers_file, tmp_path / "x.log"))
    assert status[0]["counts"]["offers_accepted"] == 5


def test_sync_filters_are_checked_and_need_reconcile(tmp_path, capsys) -> None:
    peers_file = tmp_path / "peers.toml"
    assert main(["peers", "--file", str(peers_file), "add", "https://peer.example"]) == 0
    base = ["sync", "--data", str(tmp_path / "d"), "--origin", "https://me.example", "--peers", str(peers_file)]
    capsys.readouterr()
    assert main([*base, "--reconcile", "--type", "knowledge.claim"]) == 2
    assert "not an event type" in capsys.readouterr().err
    assert main([*base, "--reconcile", "--since", "10", "--until", "5"]) == 2
    assert "until must be greater than since" in capsys.readouterr().err
    assert main([*base, "--once", "--since", "10"]) == 2
    assert "narrow --reconcile only" in capsys.readouterr().err
