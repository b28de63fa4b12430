"""``akrelay knowledge``: the offline checks reach the core and report its codes."""

from __future__ import annotations

import json

from akrelay.cli import main
from knowledge_vectors import FIXTURES, NOW, VECTORS


def _write(tmp_path, name):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(FIXTURES[name]["envelope"]), encoding="utf-8")
    return str(path)


def test_validate_resolves_targets_in_order(tmp_path, capsys):
    files = [_write(tmp_path, n) for n in ("original", "branch_left", "cross_author_supersedes")]
    assert main(["knowledge", "validate", *files]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["code"] for line in lines] == ["valid", "valid", "invalid_target"]
    assert lines[0]["hash"] == FIXTURES["original"]["envelope"]["hash"]


def test_validate_reports_missing_dependency_and_payload_errors(tmp_path, capsys):
    files = [_write(tmp_path, n) for n in ("branch_left", "noncanonical_digest", "future")]
    assert main(["knowledge", "validate", "--now-ms", str(NOW), *files]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["code"] for line in lines] == ["missing_dependency", "invalid_event", "timestamp_out_of_window"]
    assert lines[0]["data"] == {"missing": [FIXTURES["original"]["envelope"]["hash"]]}


def test_view(tmp_path, capsys):
    files = [_write(tmp_path, n) for n in ("original", "assessment", "retract_original")]
    assert main(["knowledge", "view", *files]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view[FIXTURES["original"]["envelope"]["hash"]]["status"] == "retracted"


def test_evidence_and_terms(tmp_path, capsys):
    artifact = VECTORS["research_artifacts"]["output"]
    path = tmp_path / "artifact.bin"
    path.write_bytes(bytes.fromhex(artifact["representation_hex"]))
    assert main(["knowledge", "evidence", artifact["digest"], str(path)]) == 0
    path.write_bytes(b"other")
    assert main(["knowledge", "evidence", artifact["digest"], str(path)]) == 1
    assert main(["knowledge", "terms", "Cache  LANGUAGE"]) == 0
    assert main(["knowledge", "terms", " "]) == 2
    out = capsys.readouterr().out.split()
    assert out[:2] == ["matched", "mismatched"] and json.loads(" ".join(out[2:])) == ["cache", "language"]
