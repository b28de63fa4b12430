"""The auditor (``akrelay audit``'s core) against an in-process relay: forks, rollbacks, foreign keys, bad entries."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

import pytest
from test_log_http import Node

from akrelay.client import RelayClient
from akrelay.relay.audit import AuditFailure, State, audit
from akrelay.protocol.envelope import verify_envelope
from akrelay.protocol.note import vkey
from test_audit_cli import envelope


@pytest.fixture
def node(tmp_path: Path):  # noqa: ANN201
    n = Node(tmp_path / "data")
    yield n
    n.close()


def client_of(node: Node) -> RelayClient:
    client = RelayClient("https://localhost:8443", discover=False)
    client._client = node.client  # the in-process app answers the relay's absolute URLs
    client.discover()
    return client


def test_audit_ok_then_every_kind_of_lie(node: Node, tmp_path: Path) -> None:
    node.store.commit_many([(verify_envelope(json.dumps(envelope(i)).encode()), 1) for i in range(9)])
    node.tlog.tick(force=True)
    state_file = tmp_path / "state.json"
    result = audit(client_of(node), state=State(state_file), full=True)
    assert (result.checkpoint.size, result.entries, result.records, result.previous) == (9, 9, 9, None)
    saved = json.loads(state_file.read_text())
    entry = saved["localhost:8443"]
    assert entry["size"] == 9

    # a fork: we saw another root at this size before
    forged = dict(saved)
    forged["localhost:8443"] = entry | {"root": base64.b64encode(b"\x01" * 32).decode()}
    state_file.write_text(json.dumps(forged))
    with pytest.raises(AuditFailure, match="fork") as failure:
        audit(client_of(node), state=State(state_file))
    # it says which kept checkpoint it compared with, and how to audit another relay on the same origin
    assert str(state_file) in failure.value.where and "--state" in failure.value.where
    # a rollback: we saw a larger tree before
    state_file.write_text(json.dumps({"localhost:8443": entry | {"size": 12}}))
    with pytest.raises(AuditFailure, match="shrank"):
        audit(client_of(node), state=State(state_file))
    # a key pinned for another origin
    with pytest.raises(AuditFailure, match="not for this relay"):
        audit(client_of(node), pinned=vkey("other.example", node.tlog.public_key))
    # an entry rewritten behind the relay's back: /log no longer hashes to the signed root
    conn = sqlite3.connect(node.data / "relay.sqlite3")
    conn.execute("UPDATE log_entries SET hash = ? WHERE idx = 2", (b"\x05" * 32,))
    conn.commit()
    conn.close()
    with pytest.raises(AuditFailure, match="do not hash to the checkpoint's root"):
        audit(client_of(node), full=True)


def test_audit_escapes_what_the_relay_says(monkeypatch, capsys, tmp_path) -> None:
    """A relay's error message reaches the terminal escaped (issue 24 item 12, for ``audit`` too)."""
    import akrelay.relay.audit as audit_module
    from akrelay.cli import main
    from akrelay.client import ServiceError

    def refuse(*args, **kwargs):
        raise ServiceError(400, "invalid_request", "bad\x1b]0;pwned\x07 size\x1b[2J\u009b31m")

    monkeypatch.setattr(audit_module, "audit", refuse)
    code = main(["audit", "https://relay.example", "--state", str(tmp_path / "state.json")])
    err = capsys.readouterr().err
    assert code != 0 and "the relay refused a log read" in err
    assert "\x1b" not in err and "\x07" not in err and "\u009b" not in err, repr(err)
