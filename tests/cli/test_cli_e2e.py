"""CLI end to end against a served relay: keygen -> sign -> submit -> get -> query -> batch, and withholding."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from relay_harness import start_relay

from akrelay.cli import main

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
PUBLISH = {"license": LICENSE, "kind": "observation", "title": "CLI cache note",
           "statement": "The relay accepted this through the command line.", "language": "en",
           "context": {"scope": "cli test", "conditions": [], "limitations": []}, "basis": "An end-to-end test."}


def run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.strip()], err


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    relay = start_relay(tmp_path_factory.mktemp("cli") / "data")
    yield relay
    relay.stop()


@pytest.mark.slow
def test_cli_round_trip(served, tmp_path, capsys) -> None:
    remote = ["--relay", served.origin, "--cacert", str(served.cacert)]
    key = tmp_path / "agent.key"
    code, out, _ = run(capsys, "keygen", str(key))
    assert code == 0 and json.loads(out[0])["agent_id"].startswith("did:agent:")
    assert key.stat().st_mode & 0o077 == 0
    assert run(capsys, "keygen", str(key))[0] == 2  # never silently overwrites a key

    payload = tmp_path / "publish.json"
    payload.write_text(json.dumps(PUBLISH), encoding="utf-8")
    code, out, _ = run(capsys, "sign", "publish", str(payload), "--key", str(key), "-o", str(tmp_path / "p.json"))
    assert code == 0
    publication = json.loads((tmp_path / "p.json").read_text())
    code, out, _ = run(capsys, "sign", "publish", str(payload), "--key", str(key), "--created-at", "1")
    second = json.loads(out[0])
    assert second["event"]["nonce"] == publication["event"]["nonce"] + 1  # max(last + 1, created_at)

    code, out, err = run(capsys, "submit", str(tmp_path / "p.json"), *remote)
    assert code == 0, err
    record = json.loads(out[0])
    assert record["envelope"] == publication and record["seq"] >= 1

    assess = tmp_path / "assess.json"
    assess.write_text(json.dumps({"license": LICENSE, "target": publication["hash"], "verdict": "supports",
                                  "summary": "Agrees with it.", "basis": "Read it again.",
                                  "context": {"scope": "cli test", "conditions": [], "limitations": []}}))
    code, out, err = run(capsys, "sign", "assess", str(assess), "--key", str(key), "-o", str(tmp_path / "a.json"))
    assert code == 0, err
    assessment = json.loads((tmp_path / "a.json").read_text())
    assert run(capsys, "submit", str(tmp_path / "a.json"), *remote)[0] == 0

    code, out, _ = run(capsys, "get", *remote, "--", publication["hash"])
    assert code == 0 and json.loads(out[0]) == record

    code, out, _ = run(capsys, "query", "limit=1", *remote)
    assert code == 0
    lines = [json.loads(line) for line in out]
    final = lines[-1]
    assert [r["envelope"]["hash"] for r in lines[:-1]] == [publication["hash"], assessment["hash"]]
    assert final["pages"] == 2 and final["count"] == 2 and final["checkpoint"] >= 2
    assert final["service"] == served.origin

    code, out, _ = run(capsys, "query", f"after_seq={final['checkpoint']}", *remote)
    assert code == 0 and json.loads(out[-1])["count"] == 0

    code, out, _ = run(capsys, "batch", *remote, "--", assessment["hash"], second["hash"])
    page = json.loads(out[0])
    assert code == 0 and page["missing"] == [second["hash"]]
    assert [r["envelope"]["hash"] for r in page["result"]] == [assessment["hash"]]

    # Errors are spec codes with a non-zero exit.
    code, _, err = run(capsys, "query", "kind=nope", *remote)
    assert code == 1 and "invalid_request" in err
    code, _, err = run(capsys, "get", *remote, "--", second["hash"])
    assert code == 1 and "not_found" in err

    # Withholding through the admin CLI on the live data directory.
    code, out, _ = run(capsys, "withhold", "--data", str(served.data), "--", publication["hash"])
    assert code == 0 and json.loads(out[0])["state"] == "withheld"
    code, _, err = run(capsys, "get", *remote, "--", publication["hash"])
    assert code == 1 and "not_found" in err
    code, out, _ = run(capsys, "submit", str(tmp_path / "p.json"), *remote)
    assert code == 0 and json.loads(out[0]) == record  # retained record, visibility unchanged
    assert run(capsys, "get", *remote, "--", publication["hash"])[0] == 1
    assert run(capsys, "unwithhold", "--data", str(served.data), "--", publication["hash"])[0] == 0
    assert run(capsys, "get", *remote, "--", publication["hash"])[0] == 0
    code, _, err = run(capsys, "withhold", "--data", str(served.data), "--", second["hash"])
    assert code == 1 and "not_found" in err


@pytest.mark.slow
def test_cli_refuses_an_untrusted_or_foreign_relay(served, tmp_path, capsys) -> None:
    # Without the relay's certificate the TLS handshake fails: exit 2, no data printed.
    code, out, err = run(capsys, "query", "--relay", served.origin)
    assert code == 2 and out == [] and "error" in err
    # Asking for 127.0.0.1 while the relay's origin is localhost: discovery's service differs.
    other = served.origin.replace("localhost", "127.0.0.1")
    code, out, err = run(capsys, "query", "--relay", other, "--cacert", str(served.cacert))
    assert code == 3 and "invalid_response" in err and out == []


def test_sign_rejects_bad_inputs(tmp_path, capsys) -> None:
    key = tmp_path / "k"
    assert run(capsys, "keygen", str(key))[0] == 0
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    assert run(capsys, "sign", "publish", str(bad), "--key", str(key))[0] == 2
    bad.write_text('{"kind": "observation"}', encoding="utf-8")
    code, _, err = run(capsys, "sign", "publish", str(bad), "--key", str(key))
    assert code == 2 and "invalid_event" in err
    (tmp_path / "junk.key").write_text("{}", encoding="utf-8")
    code, _, err = run(capsys, "sign", "publish", str(bad), "--key", str(tmp_path / "junk.key"))
    assert code == 2 and "cannot read key file" in err


def test_serve_help_documents_every_option() -> None:
    from akrelay.settings import OPTIONS

    text = subprocess.run([sys.executable, "-m", "akrelay", "serve", "--help"], capture_output=True, text=True,
                          check=True).stdout
    for opt in OPTIONS.values():
        assert opt.flag in text and opt.env in text
    assert "--config" in text


def _serve_on_a_taken_port(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    """``akrelay serve FLAGS`` on a port another socket listens on (never the default 8443, maybe in use)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        return subprocess.run([sys.executable, "-m", "akrelay", "serve", "--data", str(tmp_path / "data"),
                               "--port", str(port), *flags], capture_output=True, text=True, timeout=120)


def test_serve_reports_bad_settings(tmp_path) -> None:
    done = _serve_on_a_taken_port(tmp_path, "--origin", "ftp://x")
    assert done.returncode == 2 and "--origin" in done.stderr, done.stderr


@pytest.mark.parametrize("flags, fragment", [
    (("--origin", "https://x.example/path"), "--origin"),
    (("--tls-cert", "missing-cert.pem", "--tls-key", "missing-key.pem"), "TLS file not found"),
])
def test_serve_validates_settings_before_it_probes_the_port(tmp_path, flags, fragment) -> None:
    """The setting at fault is named, not the busy port, and nothing is created in the data directory."""
    done = _serve_on_a_taken_port(tmp_path, *flags)
    assert done.returncode == 2 and fragment in done.stderr and "already in use" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "data").exists()


@pytest.mark.slow
def test_serve_runs_on_embedded_defaults_from_an_empty_directory(tmp_path) -> None:
    """No flags: data in ./akrelay-data, self-signed certificate printed, HTTPS discovery answers.

    Only the port is moved (through the environment) so the test never collides with a relay on 8443.
    """
    import os
    import signal
    import time

    import httpx
    from relay_harness import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    env.update(AKRELAY_PORT=str(port), AKRELAY_ORIGIN=f"https://localhost:{port}")
    proc = subprocess.Popen([sys.executable, "-m", "akrelay", "serve"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        cert = tmp_path / "akrelay-data" / "tls-cert.pem"
        deadline = time.monotonic() + 60
        doc = None
        while time.monotonic() < deadline and doc is None:
            time.sleep(0.3)
            if cert.exists():
                try:
                    doc = httpx.get(f"https://localhost:{port}/.well-known/agent-knowledge",
                                    verify=__import__("ssl").create_default_context(cafile=str(cert)), timeout=2).json()
                except httpx.HTTPError:
                    pass
        assert doc is not None and doc["service"] == f"https://localhost:{port}"
        assert (tmp_path / "akrelay-data" / "relay.sqlite3").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert f"created self-signed TLS certificate {cert}" in output
    assert proc.returncode is not None


@pytest.mark.slow
def test_kql_and_kip_reach_a_served_relay_through_its_cacert(served, tmp_path, capsys) -> None:
    query = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} }'
    code, out, err = run(capsys, "kql", query, "--relay", served.origin, "--cacert", str(served.cacert), "--json")
    assert code == 0, err
    assert "result" in json.loads("\n".join(out))
    code, out, err = run(capsys, "kip", "DESCRIBE PRIMER", "--relay", served.origin, "--cacert", str(served.cacert))
    assert code == 0 and json.loads("\n".join(out))["status"] == "succeeded", err
    # Trusting another certificate refuses the relay cleanly, not with a traceback.
    from akrelay.tls import ensure_self_signed

    other = ensure_self_signed(tmp_path, served.origin).cert
    code, out, err = run(capsys, "kql", query, "--relay", served.origin, "--cacert", str(other))
    assert code == 1 and "cannot reach" in err and out == []
