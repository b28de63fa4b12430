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
