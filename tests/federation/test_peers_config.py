"""The peer file, the peers/sync CLI, discovery hints, leadership and per-peer trust."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from akrelay.cli import main
from akrelay.federation.peers import (Peer, PeerConfigError, PeerFile, distinct_origins, dump_peers, load_peers,
                                      parse_peers, save_peers)
from akrelay.federation.runner import federation_lock
from akrelay.federation.state import FederationState
from akrelay.federation.transport import build_ssl_context

from .conftest import Author, FakePeer, local_ids, make_engine, make_relay

REPO = Path(__file__).resolve().parents[2]


def test_example_file_parses_and_round_trips() -> None:
    peers = load_peers(REPO / "peers" / "peers.example.toml")
    assert [p.origin for p in peers.peers] == ["https://knowledge.example.org", "https://relay.lab.internal:8443"]
    lab = peers.peers[1]
    assert not lab.enabled and lab.allow_private and lab.ca_file == str(REPO / "peers" / "lab-ca.pem")
    again = parse_peers(dump_peers(peers))
    assert again.peers == peers.peers


@pytest.mark.parametrize("text, fragment", [
    ('[[peer]]\norigin = "http://x.example"', "must use https"),
    ('[[peer]]\norigin = "https://x.example/path"', "no path"),
    ('[[peer]]\norigin = "https://u@x.example"', "userinfo"),
    ('[[peer]]\norigin = "https://x.example"\n[[peer]]\norigin = "https://X.example:443"', "duplicate origin"),
    ('[[peer]]\norigin = "https://x.example"\ncolour = 1', "unknown keys"),
    ('[[peer]]\nenabled = true', "'origin' is required"),
    ('[[peer]]\norigin = "https://x.example"\npage_limit = 5000', "page_limit"),
    ('[[peer]]\norigin = "https://x.example"\ninterval = 0', "interval"),
    ('[[peer]]\norigin = "https://x.example"\nenabled = "yes"', "enabled"),
    ('[peers]\norigin = "https://x.example"', "unknown top-level"),
    ('[[peer]\n', "not valid TOML"),
])
def test_bad_peer_files_are_refused_with_a_clear_message(text: str, fragment: str) -> None:
    with pytest.raises(PeerConfigError, match=fragment):
        parse_peers(text)


def test_save_is_atomic_and_escapes_strings(tmp_path) -> None:
    path = tmp_path / "peers.toml"
    pf = PeerFile([Peer(origin="https://a.example", ca_file='/tmp/we"ird\\path.pem')])
    save_peers(path, pf)
    assert load_peers(path).peers == pf.peers
    assert [p.name for p in tmp_path.iterdir()] == ["peers.toml"]


def test_advertised_peers_are_canonical_distinct_enabled_and_never_ours() -> None:
    peers = [Peer(origin=f"https://p{i}.example") for i in range(40)]
    peers.insert(3, Peer(origin="https://ME.example:443"))
    peers.insert(5, Peer(origin="https://off.example", enabled=False))
    got = distinct_origins(peers, "https://me.example")
    assert len(got) == 32 and "https://me.example" not in got and "https://off.example" not in got
    assert len(set(got)) == 32


def test_discovery_document_lists_configured_peers(tmp_path) -> None:
    from akrelay.node import RelayNode
    from akrelay.protocol.discovery import validate_discovery
    from akrelay.settings import defaults

    path = tmp_path / "peers.toml"
    save_peers(path, PeerFile([Peer(origin="https://b.example"), Peer(origin="https://local.example"),
                               Peer(origin="https://c.example:9443", enabled=False)]))
    relay = make_relay()
    doc = RelayNode(relay, defaults(peers=str(path), origin="https://local.example"), components=("sync",)).discovery()
    assert doc["peers"] == ["https://b.example"]
    assert validate_discovery(doc, "https://local.example").peers == ("https://b.example",)


def test_cli_add_list_remove(tmp_path, capsys) -> None:
    path = tmp_path / "mesh.toml"
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert main(["peers", "--file", str(path), "add", "https://B.example", "--interval", "5"]) == 0
    assert main(["peers", "--file", str(path), "add", "https://127.0.0.1:9444", "--ca-file", str(ca),
                 "--allow-private"]) == 0
    assert main(["peers", "--file", str(path), "add", "https://b.example", "--page-limit", "50"]) == 0
    out = capsys.readouterr().out
    assert "added https://b.example" in out and "updated https://b.example" in out
    peers = load_peers(path).peers
    assert [(p.origin, p.interval, p.page_limit) for p in peers] == [
        ("https://b.example", 5.0, 50), ("https://127.0.0.1:9444", 30.0, 500)]
    assert peers[1].allow_private and peers[1].ca_file == str(ca)
    assert main(["peers", "--file", str(path), "--json", "list"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [p["origin"] for p in listed] == ["https://b.example", "https://127.0.0.1:9444"]
    assert main(["peers", "--file", str(path), "remove", "https://b.example/"]) == 0
    assert [p.origin for p in load_peers(path).peers] == ["https://127.0.0.1:9444"]
    assert main(["peers", "--file", str(path), "remove", "https://b.example"]) == 2
    assert main(["peers", "--file", str(path), "add", "http://plain.example"]) == 2
    assert main(["peers", "--file", str(path), "add", "https://x.example", "--ca-file", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "is not in" in err and "must use https" in err and "does not exist" in err


def test_cli_status_reads_the_data_directory(router, tmp_path, capsys) -> None:
    fake = FakePeer(router)
    fake.add(Author("alice").publish("One"), Author("alice").publish("Two"))
    state = FederationState.open_in(tmp_path)
    make_engine(make_relay(), [Peer(origin=fake.origin)], state).run_once()
    st = state.get(fake.origin)
    st.peer_checkpoint = 5
    st.last_error = "server: GET ... answered 503"
    state.put(st)
    state.close()
    assert main(["peers", "status", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "https://peer-a.example" in out and "checkpoint    2 (peer at 5, lag 3)" in out
    assert "answered 503" in out and "accepted=2" in out
    assert main(["peers", "--json", "status", "--data", str(tmp_path)]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["checkpoint"] == 2 and row["lag"] == 3 and row["counts"]["accepted"] == 2 and row["pending"] == 0
    assert main(["peers", "status", "--data", str(tmp_path / "empty")]) == 2


def test_hints_are_not_followed_unless_asked_and_then_bounded(router) -> None:
    a = FakePeer(router, "https://peer-a.example")
    b = FakePeer(router, "https://peer-b.example")
    c = FakePeer(router, "https://peer-c.example")
    a.discovery_doc["peers"] = ["https://peer-b.example", "https://local.example"]
    b.discovery_doc["peers"] = ["https://peer-c.example"]
    for fake, name in ((a, "a"), (b, "b"), (c, "c")):
        fake.add(Author(name).publish(f"From {name}"))
    local = make_relay()
    results = make_engine(local, [Peer(origin=a.origin)]).run_once()
    assert [r.origin for r in results] == [a.origin] and not b.discovery_route.called
    local = make_relay()
    results = make_engine(local, [Peer(origin=a.origin)], follow_hints=True, hint_hops=1).run_once()
    assert [r.origin for r in results] == [a.origin, b.origin] and not c.discovery_route.called
    assert len(local_ids(local)) == 2
    local = make_relay()
    results = make_engine(local, [Peer(origin=a.origin)], follow_hints=True, hint_hops=2).run_once()
    assert [r.origin for r in results] == [a.origin, b.origin, c.origin]
    local = make_relay()
    results = make_engine(local, [Peer(origin=a.origin)], follow_hints=True, hint_hops=2, hint_count=1).run_once()
    assert [r.origin for r in results] == [a.origin, b.origin]


def test_hinted_peers_never_get_private_access(router) -> None:
    a = FakePeer(router, "https://peer-a.example")
    b = FakePeer(router, "https://peer-b.example")
    a.discovery_doc["peers"] = ["https://peer-b.example"]
    b.add(Author("bob").publish("Hidden LAN"))
    engine = make_engine(make_relay(), [Peer(origin=a.origin, allow_private=True)], follow_hints=True,
                         resolver=lambda h, p: ["10.0.0.7"])
    first, hinted = engine.run_once()
    assert first.ok and not hinted.ok and hinted.error.startswith("refused")
    assert not b.discovery_route.called


def test_leader_lock_admits_one_holder_per_data_directory(tmp_path) -> None:
    first, second = federation_lock(tmp_path), federation_lock(tmp_path)
    assert first.acquire() and not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


def test_sync_once_refuses_while_another_process_leads(tmp_path, capsys) -> None:
    peers = tmp_path / "peers.toml"
    save_peers(peers, PeerFile([Peer(origin="https://peer-a.example")]))
    lock = federation_lock(tmp_path / "data")
    assert lock.acquire()
    try:
        code = main(["sync", "--once", "--data", str(tmp_path / "data"), "--peers", str(peers),
                     "--origin", "https://127.0.0.1:1"])
    finally:
        lock.release()
    assert code == 2 and "already syncing" in capsys.readouterr().err


def _self_signed(directory: Path, origin: str) -> Path:
    from akrelay.tls import ensure_self_signed

    return ensure_self_signed(directory, origin).cert


def test_peer_ca_file_wins_over_the_environment(tmp_path, monkeypatch) -> None:
    cert = _self_signed(tmp_path / "a", "https://127.0.0.1:9443")
    other = _self_signed(tmp_path / "b", "https://127.0.0.1:9444")
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))
    ctx = build_ssl_context(Peer(origin="https://127.0.0.1:9443", ca_file=str(cert)))
    trusted = ctx.get_ca_certs(binary_form=True)
    assert trusted == [ssl.PEM_cert_to_DER_cert(cert.read_text())]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_unreadable_ca_file_fails_only_that_peer(router, tmp_path) -> None:
    bad = FakePeer(router, "https://peer-a.example")
    good = FakePeer(router, "https://peer-b.example")
    good.add(Author("bob").publish("Fine"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    engine = make_engine(make_relay(), [Peer(origin=bad.origin, ca_file=str(tmp_path / "junk.pem")),
                                        Peer(origin=good.origin)])
    first, second = engine.run_once()
    assert not first.ok and first.error.startswith("tls") and second.ok and second.accepted == 1


def test_serve_and_sync_refuse_a_bad_peer_file_at_startup(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[peer]]\norigin = "http://plain.example"\n')
    assert main(["serve", "--data", str(tmp_path / "d"), "--peers", str(tmp_path / "missing.toml")]) == 2
    assert main(["sync", "--once", "--data", str(tmp_path / "d"), "--peers", str(bad),
                 "--origin", "https://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "must use https" in err
