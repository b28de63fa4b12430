"""Admin commands on a data directory: withhold/unwithhold, online backup and restore."""

from __future__ import annotations

import json

from relay_harness import fixture_bytes, hash_of

from akrelay.cli import main
from akrelay.service.config import ServiceConfig
from akrelay.service.relay import open_relay


def run(capsys, *argv: str):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_withhold_and_unwithhold_work_on_the_data_directory(tmp_path, capsys) -> None:
    data = tmp_path / "data"
    relay = open_relay(data, ServiceConfig())
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
    relay = open_relay(data, ServiceConfig())
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
    relay = open_relay(data, ServiceConfig())
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
    relay = open_relay(fresh, ServiceConfig())
    assert relay.submit(fixture_bytes("merge"))[0].seq == 41
    relay.close()


def test_backup_and_restore_refuse_bad_inputs(tmp_path, capsys) -> None:
    assert run(capsys, "backup", str(tmp_path / "b"), "--data", str(tmp_path / "none"))[0] == 2
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a database")
    code, _, err = run(capsys, "restore", str(junk), "--data", str(tmp_path / "d"))
    assert code == 2 and "not an akrelay store backup" in err
    assert not (tmp_path / "d" / "relay.sqlite3").exists()
