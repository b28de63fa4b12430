"""``akrelay audit`` and ``get/submit --prove`` against a served relay (issue 23).

A real ``akrelay serve``: checkpoints before and after more ingest and a kill -9
stay consistent; a record deleted or altered offline in the database is reported
by ``audit --full``, with what and where.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_harness import Served, start_relay

from akrelay.cli import main
from akrelay.protocol.signer import Signer, publish_event

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
_nonce = [0]


def envelope(i: int) -> dict[str, Any]:
    signer = Signer.from_seed(bytes([3]) * 32)
    _nonce[0] += 1
    payload = {"license": LICENSE, "kind": "observation", "title": f"Audit note {i}",
               "statement": f"Statement number {i}.", "language": "en",
               "context": {"scope": "audit test", "conditions": [], "limitations": []}, "basis": "A test."}
    return signer.sign(publish_event(signer.agent_id, int(time.time() * 1000), int(time.time() * 1000) + _nonce[0],
                                     payload))


def submit(served: Served, envs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    with httpx.Client(verify=served.ssl_context()) as client:
        for env in envs:
            response = client.post(served.origin + "/v1/knowledge/events", json=env)
            assert response.status_code == 200, response.text
            out.append(response.json())
    return out


def wait_for_checkpoint(served: Served, size: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = httpx.get(served.origin + "/v1/knowledge/checkpoint", verify=served.ssl_context()).text
        if int(text.split("\n")[1]) >= size:
            return
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of size {size} within 30 s")


def audit(capsys, served: Served, state: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["audit", served.origin, "--cacert", str(served.cacert), "--state", str(state), *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_audit_across_ingest_and_kill_9_then_offline_tampering(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    state = tmp_path / "audit.json"
    served = start_relay(data)
    try:
        records = submit(served, [envelope(i) for i in range(12)])
        wait_for_checkpoint(served, 12)
        code, out, err = audit(capsys, served, state, "--full")
        assert code == 0, err
        assert "size 12" in out and "12 records verified" in out
        saved = json.loads(state.read_text())
        assert saved["localhost:" + str(served.port)]["size"] == 12

        # more ingest, then kill -9 and a restart: the next checkpoint must extend the saved one
        submit(served, [envelope(i) for i in range(12, 20)])
        wait_for_checkpoint(served, 20)
        served.stop(signal.SIGKILL)
        served = start_relay(data, port=served.port)
        submit(served, [envelope(i) for i in range(20, 23)])
        wait_for_checkpoint(served, 23)
        code, out, err = audit(capsys, served, state)
        assert code == 0, err
        assert "consistent with size" in out and "size 23" in out

        # a pinned key that is not the relay's
        other = "localhost:%d+00000000+AQ%s" % (served.port, "A" * 42 + "=")
        code, _, err = audit(capsys, served, state, "--key", other)
        assert code != 0

        # get --prove / submit --prove
        remote = ["--relay", served.origin, "--cacert", str(served.cacert)]
        assert main(["get", "--prove", *remote, "--", records[3]["envelope"]["hash"]]) == 0
        assert "proved: seq 4 is leaf 3" in capsys.readouterr().err
        fresh = tmp_path / "fresh.json"
        fresh.write_text(json.dumps(envelope(99)))
        assert main(["submit", "--prove", str(fresh), *remote]) == 0
        assert "proved: seq 24 is leaf 23" in capsys.readouterr().err
    finally:
        served.stop()

    # offline: alter one record behind the relay's back, then delete another
    conn = sqlite3.connect(data / "relay.sqlite3")
    body = conn.execute("SELECT body FROM records WHERE seq = 7").fetchone()[0]
    conn.execute("UPDATE records SET body = ? WHERE seq = 7", (body.replace(b"Statement number", b"Statement NUMBER"),))
    conn.commit()
    conn.close()
    served = start_relay(data, port=served.port)
    try:
        code, _, err = audit(capsys, served, state, "--full")
        assert code == 1 and "MISMATCH" in err
        assert "does not verify" in err and "index 6, seq 7" in err, err
    finally:
        served.stop()
    conn = sqlite3.connect(data / "relay.sqlite3")
    conn.execute("DELETE FROM terms WHERE seq = 5")
    conn.execute("DELETE FROM records WHERE seq = 5")
    conn.commit()
    conn.close()
    served = start_relay(data, port=served.port)
    try:
        code, _, err = audit(capsys, served, state, "--full")
        assert code == 1
        assert "index 4, seq 5" in err, err
        code, _, err = audit(capsys, served, state)  # without --full the signed log itself is still fine
        assert code == 0, err
    finally:
        served.stop()
