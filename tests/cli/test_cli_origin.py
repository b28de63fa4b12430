"""Commands that need the relay's own origin take it from --origin or the data directory, never a guess.

``sync --once`` used to assume https://localhost:8443 and drop a peer there as itself
(rc 0, nothing said); ``reindex --kip`` stamped that origin into the KIP Space id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from akrelay.cli import main
from akrelay.node import RelayNode
from akrelay.settings import defaults

LOCALHOST = "https://localhost:8443"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    RelayNode.open(defaults(data=str(directory)), components=()).stop()
    return directory


def record_origin(data: Path, origin: str) -> None:
    from akrelay.settings import record_origin as record  # imported here: the module runs against old code too

    record(data, origin)


def _peers(tmp_path: Path, *origins: str) -> Path:
    path = tmp_path / "peers.toml"
    path.write_text("".join(f'[[peer]]\norigin = "{o}"\nconnect_timeout = 2\nread_timeout = 2\n' for o in origins),
                    encoding="utf-8")
    return path


def test_serve_records_the_origin_it_serves(tmp_path) -> None:
    from akrelay.process.launcher import prepare
    from akrelay.settings import recorded_origin

    prepare(defaults(data=str(tmp_path / "d"), origin="https://relay.example.org"), out=open("/dev/null", "w"))
    assert recorded_origin(tmp_path / "d") == "https://relay.example.org"


def test_sync_once_without_a_known_origin_refuses_instead_of_guessing(data, tmp_path, capsys) -> None:
    assert main(["sync", "--once", "--data", str(data), "--peers", str(_peers(tmp_path, LOCALHOST))]) == 2
    err = capsys.readouterr().err
    assert "has no recorded origin" in err and "pass --origin" in err


def test_sync_once_takes_a_peer_on_localhost_when_the_relay_is_elsewhere(data, tmp_path, capsys) -> None:
    record_origin(data, "https://relay-a.example")
    code = main(["sync", "--once", "--data", str(data), "--peers", str(_peers(tmp_path, LOCALHOST))])
    out = capsys.readouterr().out
    assert code == 1 and f"{LOCALHOST}: failed" in out  # tried (a loopback peer needs allow_private)


def test_sync_once_says_when_it_skips_its_own_origin(data, tmp_path, capsys) -> None:
    record_origin(data, LOCALHOST)
    assert main(["sync", "--once", "--data", str(data), "--peers", str(_peers(tmp_path, LOCALHOST))]) == 1
    err = capsys.readouterr().err
    assert f"not syncing from {LOCALHOST}: it is this relay's own origin" in err
    assert "no peer to sync from" in err


def test_sync_once_with_origin_flag_names_the_flag_when_skipping(data, tmp_path, capsys) -> None:
    peers = _peers(tmp_path, "https://127.0.0.2:9", "https://127.0.0.3:9")
    main(["sync", "--once", "--data", str(data), "--peers", str(peers), "--origin", "https://127.0.0.2:9"])
    captured = capsys.readouterr()
    assert "not syncing from https://127.0.0.2:9: it is this relay's own origin (--origin)" in captured.err
    assert "https://127.0.0.3:9: failed" in captured.out


def test_reindex_kip_stamps_the_recorded_origin(data, capsys) -> None:
    record_origin(data, "https://relay.example.org")
    assert main(["reindex", "--kip", "--data", str(data)]) == 0
    assert json.loads(capsys.readouterr().out)["space_id"] == "akrelay:relay.example.org"


def test_reindex_kip_without_a_known_origin_refuses(data) -> None:
    with pytest.raises(SystemExit, match="has no recorded origin"):
        main(["reindex", "--kip", "--data", str(data)])
