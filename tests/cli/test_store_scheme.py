"""``--store`` is parsed by the backend registry (akrelay.backend.BACKENDS), not by the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from akrelay.backend import BACKENDS, RedisBackend, SqliteBackend, backend_class
from akrelay.cli import main
from akrelay.node import check_components
from akrelay.settings import SettingsError, defaults, load_settings


def test_the_settings_keep_the_value_as_given() -> None:
    assert load_settings({"store": "  mysql://db/1 "}, {}).store == "mysql://db/1"
    assert load_settings({}, {"AKRELAY_STORE": "sqlite"}).store == "sqlite"


@pytest.mark.parametrize(("value", "cls"), [("", SqliteBackend), ("sqlite", SqliteBackend),
                                            ("redis://127.0.0.1:6379/0", RedisBackend),
                                            ("rediss://cache.example:6380/2", RedisBackend),
                                            ("unix:///run/redis.sock", RedisBackend)])
def test_the_registry_serves_each_known_form(value: str, cls: type) -> None:
    assert backend_class(defaults(store=value)) is cls


@pytest.mark.parametrize("value", ["mysql://db/1", "redis", "redis:/x", "http://127.0.0.1:6379"])
def test_an_unknown_store_names_the_value_and_the_served_forms(value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        backend_class(defaults(store=value))
    message = str(caught.value)
    assert f"--store {value!r}" in message
    assert all(f"{scheme}://" in message for scheme in RedisBackend.schemes) and "sqlite" in message


def test_a_third_scheme_is_one_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "valkey", RedisBackend)
    assert backend_class(defaults(store="valkey://h:1/0")) is RedisBackend


def test_serve_and_sync_refuse_it_before_anything_opens(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="no backend serves it"):
        check_components(defaults(data=str(tmp_path / "data"), store="mysql://db/1"))
    assert not (tmp_path / "data").exists()


def test_the_cli_says_so_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["peers", "status", "--data", str(tmp_path), "--store", "mysql://db/1"]) != 0
    err = capsys.readouterr().err
    assert "--store 'mysql://db/1': no backend serves it" in err and "Traceback" not in err
    assert main(["store", "migrate", "--data", str(tmp_path), "--to", "mysql://db/1"]) == 2
    assert "--store 'mysql://db/1': no backend serves it" in capsys.readouterr().err


def test_peers_status_reads_the_state_the_backend_keeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No state file in --data (SQLite): the backend keeps none yet, and the CLI says where it looked."""
    assert main(["peers", "status", "--data", str(tmp_path), "--store", "sqlite"]) != 0
    assert f"no sync state in {tmp_path}" in capsys.readouterr().err
