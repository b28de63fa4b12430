"""``akrelay identity``: the identity core on local files, including its error paths."""

from __future__ import annotations

import json
from pathlib import Path

from akrelay.cli import main

from identity_support import KNOWLEDGE

IDENTITY = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "agent-identity-1.0.vectors.json").read_text())


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data, ensure_ascii=False).encode())
    return str(path)


def test_jcs_and_hash_reproduce_the_vectors(tmp_path, capsys):
    for vector in IDENTITY["events"]:
        path = _write(tmp_path, "event.json", vector["event"])
        assert main(["identity", "jcs", path]) == 0
        assert capsys.readouterr().out == vector["jcs"] + "\n"
        assert main(["identity", "hash", path]) == 0
        assert capsys.readouterr().out.strip() == vector["hash"]


def test_verify_accepts_signed_envelopes_with_declared_extra_fields(tmp_path, capsys):
    vector = IDENTITY["events"][1]
    envelope = {"hash": vector["hash"], "event": vector["event"], "signature": vector["signature"]}
    path = _write(tmp_path, "env.json", envelope)
    extra = [a for f in ("room_id", "base_seq", "base_hash", "mentions") for a in ("--extra-field", f)]
    assert main(["identity", "verify", path, *extra]) == 0
    assert capsys.readouterr().out.strip() == vector["hash"]
    assert main(["identity", "verify", path]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_event"


def test_verify_reports_hash_and_signature_errors(tmp_path, capsys):
    vector = IDENTITY["events"][0]
    envelope = {"hash": vector["hash"], "event": dict(vector["event"], nonce=1), "signature": vector["signature"]}
    assert main(["identity", "verify", _write(tmp_path, "a.json", envelope)]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_event_hash"
    envelope = {"hash": vector["hash"], "event": vector["event"], "signature": "A" * 86}
    assert main(["identity", "verify", _write(tmp_path, "b.json", envelope)]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_signature"


def test_strict_json_errors_and_missing_files(tmp_path, capsys):
    assert main(["identity", "jcs", _write(tmp_path, "dup.json", b'{"a":1,"a":2}')]) == 1
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "invalid_event" and "duplicate" in error["message"]
    assert main(["identity", "hash", str(tmp_path / "absent.json")]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_request"


def test_agent_id_from_seed_and_public_key(capsys):
    key = IDENTITY["keys"][0]
    assert main(["identity", "agent-id", "--seed-hex", key["seed"]]) == 0
    assert capsys.readouterr().out.strip() == key["agent_id"]
    assert main(["identity", "agent-id", "--public-key", key["public_key"]]) == 0
    assert capsys.readouterr().out.strip() == key["agent_id"]
    assert main(["identity", "agent-id", "--public-key", key["public_key"] + "="]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_request"
    assert main(["identity", "agent-id", "--seed-hex", "00"]) == 1
    capsys.readouterr()
    assert main(["identity", "agent-id", "--seed-hex", KNOWLEDGE["seeds"]["publisher"]]) == 0
    assert capsys.readouterr().out.strip().startswith("did:agent:iEuIV")


def test_jcs_and_hash_refuse_non_i_json_and_unreadable_files(tmp_path, capsys):
    duplicate = _write(tmp_path, "dup.json", b'{"a": 1, "a": 2}')
    for command in ("jcs", "hash"):
        assert main(["identity", command, duplicate]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert json.loads(captured.err)["error"]["code"] == "invalid_event"
        assert main(["identity", command, str(tmp_path / "absent.json")]) == 1
        assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_request"
