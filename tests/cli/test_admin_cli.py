"""Admin commands on a data directory: withhold/unwithhold, online backup and restore."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from relay_harness import fixture_bytes, hash_of

from akrelay.cli import main
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import open_relay


def run(capsys, *argv: str):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_withhold_and_unwithhold_work_on_the_data_directory(tmp_path, capsys) -> None:
    data = tmp_path / "data"
    relay = open_relay(data, RelayConfig())
    relay.submit(fixture_bytes("old_event"))
    event_id = hash_of("old_event")
    code, out, _ = run(capsys, "withhold", "--data", str(data), "--", event_id)
    assert code == 0 and json.loads(out) == {"event_id": event_id, "seq": 1, "state": "withheld"}
    assert relay.store.get(event_id).withheld  # the live relay sees it
    assert run(capsys, "unwithhold", "--data", str(data), "--", event_id)[0] == 0
    assert not relay.store.get(event_id).withheld
    code, _, err = run(capsys, "withhold", "--data", str(data), "--", "not-an-id")
    assert code == 1 and "invalid_request" in err
    # Event IDs may start with '-': after `--` they are still IDs, not options.
    code, _, err = run(capsys, "withhold", "--data", str(data), "--", "-" + "A" * 42)
    assert code == 1 and "not_found" in err
    code, _, err = run(capsys, "withhold", "--data", str(tmp_path / "empty"), "--", event_id)
    assert code == 2 and "no relay data" in err
    relay.close()


def test_online_backup_and_restore_keep_the_high_water_mark(tmp_path, capsys) -> None:
    data = tmp_path / "data"
    relay = open_relay(data, RelayConfig())
    for name in ("original", "branch_left", "branch_right"):
        relay.submit(fixture_bytes(name))
    backup = tmp_path / "backup.sqlite3"
    code, out, _ = run(capsys, "backup", str(backup), "--data", str(data))  # while the relay is open
    assert code == 0 and json.loads(out)["checkpoint"] == 3
    for name in ("merge", "assessment"):
        relay.submit(fixture_bytes(name))
    assert relay.checkpoint() == 5
    relay.close()

    code, out, _ = run(capsys, "restore", str(backup), "--data", str(data))
    assert code == 0 and json.loads(out)["high_water_mark"] == 5
    relay = open_relay(data, RelayConfig())
    try:
        assert relay.checkpoint() == 5  # never goes back
        assert relay.store.get(hash_of("merge")) is None  # the backup predates it
        assert relay.get(hash_of("original")).seq == 1
        record, created = relay.submit(fixture_bytes("merge"))
        assert created and record.seq == 6  # seq 4 and 5 are never reused
    finally:
        relay.close()

    # Restoring where the old store is lost: --min-seq keeps the promise.
    fresh = tmp_path / "fresh"
    code, out, _ = run(capsys, "restore", str(backup), "--data", str(fresh), "--min-seq", "40")
    assert code == 0 and json.loads(out)["high_water_mark"] == 40
    relay = open_relay(fresh, RelayConfig())
    assert relay.submit(fixture_bytes("merge"))[0].seq == 41
    relay.close()


def test_backup_and_restore_refuse_bad_inputs(tmp_path, capsys) -> None:
    assert run(capsys, "backup", str(tmp_path / "b"), "--data", str(tmp_path / "none"))[0] == 2
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a database")
    code, _, err = run(capsys, "restore", str(junk), "--data", str(tmp_path / "d"))
    assert code == 2 and "not an akrelay store backup" in err
    assert not (tmp_path / "d" / "relay.sqlite3").exists()


def test_restore_is_refused_while_the_relay_has_the_store_open(tmp_path, capsys) -> None:
    """Issue 24 item 10: a running relay would keep writing to the replaced file; nothing is changed."""
    data = tmp_path / "data"
    relay = open_relay(data, RelayConfig())
    try:
        relay.submit(fixture_bytes("original"))
        backup = tmp_path / "backup.sqlite3"
        assert run(capsys, "backup", str(backup), "--data", str(data))[0] == 0
        relay.submit(fixture_bytes("branch_left"))
        before = (data / "relay.sqlite3").stat().st_ino
        code, out, err = run(capsys, "restore", str(backup), "--data", str(data))
        assert code == 1 and out == ""
        assert "the relay is running" in err and "stop it first" in err and "Traceback" not in err
        assert (data / "relay.sqlite3").stat().st_ino == before and not (data / "relay.sqlite3.restore").exists()
        record, created = relay.submit(fixture_bytes("branch_right"))  # the relay goes on, in the same file
        assert created and record.seq == 3
    finally:
        relay.close()
    code, out, _ = run(capsys, "restore", str(backup), "--data", str(data))  # stopped: allowed
    assert code == 0 and json.loads(out)["high_water_mark"] == 3


def test_a_seq_is_never_reused_after_restoring_where_the_store_was_lost(tmp_path, capsys) -> None:
    """The bound kept beside the store (relay.sqlite3.hwm) survives the file: no --min-seq needed."""
    data = tmp_path / "data"
    relay = open_relay(data, RelayConfig())
    relay.submit(fixture_bytes("original"))
    backup = tmp_path / "backup.sqlite3"
    assert run(capsys, "backup", str(backup), "--data", str(data))[0] == 0
    handed_out = [relay.submit(fixture_bytes(name))[0].seq for name in ("branch_left", "branch_right", "merge")]
    relay.close()
    assert handed_out == [2, 3, 4]
    for suffix in ("", "-wal", "-shm"):  # the disk lost the store (not its directory)
        (data / f"relay.sqlite3{suffix}").unlink(missing_ok=True)

    code, out, _ = run(capsys, "restore", str(backup), "--data", str(data))
    assert code == 0 and json.loads(out)["high_water_mark"] > max(handed_out)
    relay = open_relay(data, RelayConfig())
    try:
        assert relay.get(hash_of("original")).seq == 1
        record, created = relay.submit(fixture_bytes("branch_left"))  # accepted again, after the backup's
        assert created and record.seq > max(handed_out)
    finally:
        relay.close()


@pytest.mark.slow
def test_restore_is_refused_while_akrelay_serve_runs(tmp_path) -> None:
    """The real command: the served relay's processes hold the store open; a restore changes nothing."""
    import httpx
    from relay_harness import start_relay

    data = tmp_path / "node"
    served = start_relay(data)
    try:
        backup = tmp_path / "backup.sqlite3"
        assert run_cli("backup", str(backup), "--data", str(data)).returncode == 0
        with httpx.Client(verify=served.ssl_context(), timeout=10) as client:
            first = client.post(served.origin + "/v1/knowledge/events", content=fixture_bytes("original"),
                                headers={"content-type": "application/json"})
            assert first.status_code == 200, first.text
            refused = run_cli("restore", str(backup), "--data", str(data))
            assert refused.returncode == 1 and "the relay is running" in refused.stderr
            assert "Traceback" not in refused.stderr
            second = client.post(served.origin + "/v1/knowledge/events", content=fixture_bytes("branch_left"),
                                 headers={"content-type": "application/json"})
            assert second.status_code == 200 and second.json()["seq"] == 2
    finally:
        served.stop()
    allowed = run_cli("restore", str(backup), "--data", str(data))  # stopped: the restore goes ahead
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["high_water_mark"] == 2


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``akrelay`` as its own process (the relay under test runs in others)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    return subprocess.run([sys.executable, "-m", "akrelay", *argv], capture_output=True, text=True, timeout=120,
                          env=env)
