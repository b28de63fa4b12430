"""``akrelay kip``, ``akrelay kip --belief`` and ``akrelay kip-reindex`` against a data directory."""

from __future__ import annotations

import json

from akrelay.cli import main
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import open_relay

from .conftest import vector_fixtures

ORIGIN = "https://relay.example.org"


def _relay_dir(tmp_path, names):
    import json as _json
    from pathlib import Path

    vectors = _json.loads((Path(__file__).resolve().parents[1] / "vectors" /
                           "agent-knowledge-1.0.vectors.json").read_text())
    relay = open_relay(tmp_path, RelayConfig(origin=ORIGIN), clock=lambda: vectors["now"])
    fixtures = vector_fixtures()
    for name in names:
        relay.submit(_json.dumps(fixtures[name]["envelope"]).encode())
    relay.close()
    return fixtures


def test_reindex_then_describe(tmp_path, capsys) -> None:
    _relay_dir(tmp_path, ["original", "derivative", "assessment"])
    assert main(["kip-reindex", "--data", str(tmp_path), "--origin", ORIGIN]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["space_seq"] == 3 and summary["space_id"] == "akrelay:relay.example.org"
    assert (tmp_path / "kip-nexus.sqlite3").is_file()
    assert main(["kip", "DESCRIBE SNAPSHOT", "--data", str(tmp_path), "--origin", ORIGIN]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "succeeded" and out["results"][0]["result"]["space_seq"] == 3
    assert main(["kip", "SEARCH CONCEPT :q", "--param", "q=cache", "--data", str(tmp_path), "--origin", ORIGIN]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["result"]["hits"]


def test_belief_and_refusals(tmp_path, capsys) -> None:
    fixtures = _relay_dir(tmp_path, ["original", "derivative", "assessment", "retract_assessment"])
    original = fixtures["original"]["envelope"]["hash"]
    assert main(["kip", original, "--belief", "--data", str(tmp_path), "--origin", ORIGIN]) == 0
    now = json.loads(capsys.readouterr().out)
    assert main(["kip", original, "--belief", "--as-of", "3", "--data", str(tmp_path), "--origin", ORIGIN]) == 0
    then = json.loads(capsys.readouterr().out)
    # another actor reproduced the original (accepted), then retracted that assessment:
    # only the author supports it again (uncorroborated under the default policy)
    assert then["basis"]["snapshot_seq"] == 3 and now["basis"]["snapshot_seq"] == 4
    assert (then["status"], now["status"]) == ("accepted", "uncertain")
    assert now["uncertainty"]["reasons"] == ["uncorroborated"]
    assert main(["kip", 'CREATE CONCEPT ?x {type: "Agent"}', "--data", str(tmp_path), "--origin", ORIGIN]) == 1
    assert json.loads(capsys.readouterr().out)["results"][0]["error"]["code"] == "ReadonlyViolation"
    assert main(["kip", "nope", "--belief", "--data", str(tmp_path), "--origin", ORIGIN]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "NotFoundOrNotVisible"


def test_reindex_kip_flag_rebuilds_the_nexus(tmp_path, capsys) -> None:
    _relay_dir(tmp_path, ["original", "assessment"])
    assert main(["reindex", "--kip", "--data", str(tmp_path), "--origin", ORIGIN]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["space_seq"] == 2 and summary["transactions"] == 2
    assert (tmp_path / "kip-nexus.sqlite3").is_file()
