"""Local checks of the client commands end in one line with the spec's code, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from akrelay.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
#: Nothing listens here; a command that got as far as connecting would say "cannot reach".
NOWHERE = "https://127.0.0.1:9"


@pytest.fixture
def signed(tmp_path, capsys) -> Path:
    key = tmp_path / "k.json"
    assert main(["keygen", str(key)]) == 0
    out = tmp_path / "e.json"
    assert main(["sign", "publish", str(EXAMPLES / "publish.json"), "--key", str(key), "-o", str(out)]) == 0
    capsys.readouterr()
    return out


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


@pytest.mark.parametrize(("edit", "code"), [
    (lambda e: e["event"]["payload"].update(title="Edited after signing"), "invalid_event_hash"),
    (lambda e: e.update(signature="A" * 86), "invalid_signature"),
])
def test_submit_refuses_an_envelope_that_fails_its_local_check(signed, tmp_path, capsys, edit, code) -> None:
    envelope = json.loads(signed.read_text())
    edit(envelope)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(envelope))
    assert main(["submit", str(signed), str(bad), "--relay", NOWHERE]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {bad}: {code}: ")
    assert "no envelope was submitted" in line  # the good one before it was not sent either


def test_sign_with_an_exhausted_nonce_says_so_in_one_line(tmp_path, capsys) -> None:
    key = tmp_path / "k.json"
    assert main(["keygen", str(key)]) == 0
    Path(str(key) + ".nonce").write_text(str(2**53 - 1))
    sign = ["sign", "publish", str(EXAMPLES / "publish.json"), "--key", str(key)]
    assert main(sign) == 0  # the last nonce there is
    capsys.readouterr()
    assert main(sign) == 2
    assert "nonce" in _one_error_line(capsys)


def test_sign_refuses_a_created_at_out_of_range(tmp_path, capsys) -> None:
    key = tmp_path / "k.json"
    assert main(["keygen", str(key)]) == 0
    capsys.readouterr()
    assert main(["sign", "publish", str(EXAMPLES / "publish.json"), "--key", str(key),
                 "--created-at", str(10**20)]) == 2
    assert "--created-at" in _one_error_line(capsys)


def test_query_with_a_non_integer_limit_says_so(capsys) -> None:
    assert main(["query", "limit=abc", "--relay", NOWHERE]) == 2
    assert _one_error_line(capsys) == "error: after_seq and limit take a decimal integer"


def test_ask_names_the_relay_it_cannot_reach(capsys) -> None:
    assert main(["ask", "what?", "--relay", NOWHERE]) == 2
    assert _one_error_line(capsys).startswith(f"error: cannot reach {NOWHERE}: ")
