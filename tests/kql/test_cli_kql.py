"""``akrelay kql`` against a local data directory: table, JSON, parameters, errors."""

from __future__ import annotations

import json

from akrelay.cli import main
from akrelay.cli.kql import format_table, parse_params
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import open_relay

from .fixtures import Log

ORIGIN = "https://kql.relay.example"


def _data_dir(tmp_path) -> Log:
    log = Log()
    a = log.publish("alice", "Water boils at 100 C", tags=["physics"])
    log.publish("bob", "Ice melts at 0 C", tags=["physics"], relations=[("extends", a)])
    log.assess("bob", a, "supports")
    relay = open_relay(tmp_path, RelayConfig(origin=ORIGIN), clock=lambda: log.clock + 1000)
    for record in log.records:
        outcome = relay.submit(record.envelope.to_json() if hasattr(record.envelope, "to_json")
                               else json.dumps({"hash": record.envelope.id, "event": record.envelope.event,
                                                "signature": record.envelope.signature}).encode())
        assert outcome is not None
    relay.close()
    return log


def test_table_output_with_parameters(tmp_path, capsys) -> None:
    log = _data_dir(tmp_path)
    code = main(["kql", 'FIND(?c.name, ?a.key) WHERE { ?a {type: "Agent", key: :who} '
                        'STRUCTURAL (?c, "ak_published_by", ?a) } ORDER BY ?c.name',
                 "--param", f"who={log.did('alice')}", "--data", str(tmp_path), "--origin", ORIGIN])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["?c.name", "?a.key"]
    assert "Water boils at 100 C" in lines[2] and log.did("alice") in lines[2]
    assert lines[-1] == "(1 row)"


def test_json_output_and_belief(tmp_path, capsys) -> None:
    _data_dir(tmp_path)
    code = main(["kql", 'FIND(?c.name, ?b.status) WHERE { ?c {type: "KnowledgeCapsule", name: :n} '
                        '?b BELIEF (?c, "ak_holds", true) }', "--param", "n=Water boils at 100 C",
                 "--data", str(tmp_path), "--origin", ORIGIN, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["result"]["rows"] == [["Water boils at 100 C", "accepted"]]
    assert doc["context"]["snapshot_seq"] == 3
    assert doc["context"]["projection_basis"]["policy"]["id"] == "akrelay:corroborated"


def test_errors_exit_1_with_position_and_hint(tmp_path, capsys) -> None:
    _data_dir(tmp_path)
    assert main(["kql", "FIND(?c) WHERE { ?c {name: 'x'} }", "--data", str(tmp_path), "--origin", ORIGIN]) == 1
    err = capsys.readouterr().err
    assert "InvalidSyntax (line 1, column 28)" in err and "double quotes" in err
    assert main(["kql", "FIND(?c) WHERE { ?c {name: :n} }", "--data", str(tmp_path), "--origin", ORIGIN]) == 1
    assert "ReferenceError" in capsys.readouterr().err


def test_param_parsing_and_table_format() -> None:
    assert parse_params(["n=5", "s=text", 'o={"a": 1}', ":t=true"]) == {"n": 5, "s": "text", "o": {"a": 1}, "t": True}
    table = format_table({"columns": ["?x", "?y.name"], "rows": [[{"kind": "concept", "id": "c1.2", "name": "A"}, None]],
                          "next_cursor": "abc"})
    assert "concept:c1.2 (A)" in table and "null" in table and "next cursor: abc" in table


def test_relay_mode_posts_a_kip_request(capsys) -> None:
    import httpx
    import respx

    envelope = {"kip": "2.0", "status": "succeeded", "results": [{
        "status": "succeeded", "result": {"layout": "rows", "columns": ["?c.name"], "rows": [["Remote"]],
                                          "row_count": 1},
        "next_cursor": "tok", "context": {"space_id": "akrelay:r.example", "snapshot_seq": 9}}]}
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post("https://r.example/v1/kip").mock(return_value=httpx.Response(200, json=envelope))
        code = main(["kql", "FIND(?c.name) WHERE { ?c {name: :n} }", "--param", "n=Remote",
                     "--relay", "https://r.example/"])
    assert code == 0
    sent = json.loads(route.calls[0].request.content)
    assert sent["operations"] == [{"language": "KQL", "command": "FIND(?c.name) WHERE { ?c {name: :n} }",
                                   "parameters": {"n": "Remote"}}]
    out = capsys.readouterr().out
    assert "Remote" in out and "next cursor: tok" in out

    failed = {"kip": "2.0", "status": "failed", "results": [{
        "status": "failed", "error": {"code": "InvalidSyntax", "message": "bad", "hint": "fix it",
                                      "details": {"line": 1, "column": 3}}}]}
    with respx.mock() as mock:
        mock.post("https://r.example/v1/kip").mock(return_value=httpx.Response(200, json=failed))
        assert main(["kql", "FI", "--relay", "https://r.example"]) == 1
    assert "InvalidSyntax (line 1, column 3): bad" in capsys.readouterr().err


def test_relay_mode_reports_a_non_kip_answer(capsys) -> None:
    import httpx
    import respx

    with respx.mock() as mock:
        mock.post("https://r.example/v1/kip").mock(return_value=httpx.Response(502, text="<html>bad gateway</html>"))
        assert main(["kql", "FIND(?c) WHERE { ?c {type: \"Agent\"} }", "--relay", "https://r.example"]) == 1
        assert main(["kip", "DESCRIBE PRIMER", "--relay", "https://r.example"]) == 1
    err = capsys.readouterr().err
    assert err.count("answered HTTP 502 without a KIP response envelope") == 2


def test_kql_and_kip_refuse_a_directory_without_a_relay_store(tmp_path) -> None:
    import pytest

    empty = tmp_path / "empty"
    empty.mkdir()
    for argv, prefix in ((["kql", "FIND(?c) WHERE { ?c {type: \"Agent\"} }"], "akrelay kql:"),
                         (["kip", "DESCRIBE PRIMER"], "akrelay:")):
        with pytest.raises(SystemExit) as info:
            main(argv + ["--data", str(empty), "--origin", ORIGIN])
        assert str(info.value).startswith(f"{prefix} no relay store in ")
    assert list(empty.iterdir()) == []  # nothing was created
