"""Serve options: flag > environment > TOML file > default, and clear errors."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from akrelay.optionkit import OPTION_KEY, setting
from akrelay.search.options import SearchSettings
from akrelay.settings import (
    AREAS, OPTIONS, Settings, SettingsError, add_arguments, from_resolved_env, licence_allow_list, load_settings,
    option,
)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_match_the_issue() -> None:
    s = load_settings(parse([]), env={})
    assert (s.data, s.host, s.port, s.origin) == ("./akrelay-data", "127.0.0.1", 8443, "https://localhost:8443")
    assert s.max_envelope_bytes == 262144 and s.workers == 1
    assert s.licence_allow == () and s.refuse_legacy_retract is False
    assert set(s.sources.values()) == {"default"}


def test_precedence_flag_over_env_over_file_over_default(tmp_path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text('port = 7001\nworkers = 3\nhost = "127.0.0.2"\nread-rate = 5\n', encoding="utf-8")
    env = {"AKRELAY_PORT": "7002", "AKRELAY_WORKERS": "4"}
    s = load_settings(parse(["--config", str(cfg), "--port", "7003"]), env=env)
    assert s.port == 7003 and s.sources["port"] == "flag"
    assert s.workers == 4 and s.sources["workers"] == "env"
    assert s.host == "127.0.0.2" and s.sources["host"] == "file"
    assert s.read_rate == 5.0
    # No --origin anywhere: it follows the address served (issue 11), not the default port.
    assert s.origin == "https://127.0.0.2:7003" and s.sources["origin"] == "default"


@pytest.mark.parametrize("argv, origin", [
    (["--port", "18443"], "https://localhost:18443"),
    (["--host", "0.0.0.0", "--port", "18443"], "https://localhost:18443"),
    (["--host", "::1", "--port", "9443"], "https://localhost:9443"),
    (["--host", "10.0.0.7", "--port", "18443"], "https://10.0.0.7:18443"),
    (["--host", "fd00::7"], "https://[fd00::7]:8443"),
    (["--host", "relay.example.org", "--port", "443"], "https://relay.example.org:443"),
    (["--port", "18443", "--origin", "https://relay.example.org"], "https://relay.example.org"),
])
def test_origin_follows_the_address_served_unless_given(argv, origin) -> None:
    assert load_settings(parse(argv), env={}).origin == origin


def test_body_timeout_is_a_positive_number_of_seconds() -> None:
    assert load_settings(parse([]), env={}).body_timeout == 30.0
    assert load_settings(parse(["--body-timeout", "2.5"]), env={}).body_timeout == 2.5
    assert load_settings(parse([]), env={"AKRELAY_BODY_TIMEOUT": "7"}).body_timeout == 7.0
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SettingsError, match="--body-timeout"):
            load_settings(parse(["--body-timeout", bad]), env={})


def test_config_file_from_environment(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("refuse_legacy_retract = true\nlicence_allow = ['https://l.example/a']\n", encoding="utf-8")
    s = load_settings(parse([]), env={"AKRELAY_CONFIG": str(cfg)})
    assert s.refuse_legacy_retract is True
    assert licence_allow_list(s) == frozenset({"https://l.example/a"})


@pytest.mark.parametrize("argv, env, fragment", [
    (["--port", "x"], {}, "--port"),
    (["--port", "70000"], {}, "TCP port"),
    (["--workers", "0"], {}, "--workers"),
    ([], {"AKRELAY_MAX_ENVELOPE_BYTES": "-1"}, "AKRELAY_MAX_ENVELOPE_BYTES"),
    ([], {"AKRELAY_WRITE_RATE": "fast"}, "AKRELAY_WRITE_RATE"),
    ([], {"AKRELAY_REFUSE_LEGACY_RETRACT": "maybe"}, "boolean"),
    (["--tls-cert", "a.pem"], {}, "together"),
])
def test_bad_values_are_reported_with_their_source(argv, env, fragment) -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings(parse(argv), env=env)
    assert fragment in str(exc.value)


def test_bad_config_files(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("port = [", encoding="utf-8")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(parse(["--config", str(bad)]), env={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("prot = 1\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="unknown option 'prot'"):
        load_settings(parse(["--config", str(unknown)]), env={})
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(parse(["--config", str(tmp_path / "none.toml")]), env={})


def test_licence_allow_expands_files_and_urls(tmp_path) -> None:
    listing = tmp_path / "licences.txt"
    listing.write_text("# allowed\nhttps://creativecommons.org/licenses/by/4.0/\n\n", encoding="utf-8")
    s = load_settings(parse(["--licence-allow", str(listing), "https://example.com/l"]), env={})
    assert licence_allow_list(s) == frozenset({"https://creativecommons.org/licenses/by/4.0/", "https://example.com/l"})
    assert licence_allow_list(load_settings(parse([]), env={})) is None
    with pytest.raises(SettingsError, match="cannot read"):
        licence_allow_list(load_settings(parse(["--licence-allow", str(tmp_path / "nope")]), env={}))


def test_adding_an_option_is_one_call_and_reaches_every_source() -> None:
    opt = option("test_only_knob", int, 7, "a knob for this test")
    try:

        @dataclass(frozen=True)
        class KnobSettings:
            knob: int = setting("test_only_knob")

        assert load_settings(parse([]), env={}).view(KnobSettings).knob == 7
        assert load_settings(parse(["--test-only-knob", "9"]), env={}).view(KnobSettings).knob == 9
        assert load_settings(parse([]), env={opt.env: "11"}).view(KnobSettings) == KnobSettings(11)
    finally:
        del OPTIONS["test_only_knob"]


def test_every_option_is_one_typed_field_of_the_settings() -> None:
    """Each option is held by exactly one field (relay-wide or of one area), whose type its default has."""
    held: list[str] = []
    for cls in (Settings, *AREAS.values()):
        for f in dataclasses.fields(cls):
            if OPTION_KEY in f.metadata:
                held.append(f.metadata[OPTION_KEY])
    assert sorted(held) == sorted(OPTIONS)
    s = load_settings(parse([]), env={})
    assert isinstance(s.search, SearchSettings) and s.search.candidates == OPTIONS["search_candidates"].default
    assert s.federation.reconcile_interval == 3600.0 and s.knowql.rate == 10.0 and s.kip.budget_ms > 0
    assert s.explorer.disabled is False and s.observability.log_json is False
    flagged = load_settings(parse(["--no-explorer", "--search-candidates", "5", "--peers", "p.toml"]), env={})
    assert (flagged.explorer.disabled, flagged.search.candidates, flagged.federation.peers) == (True, 5, "p.toml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.search.candidates = 1  # type: ignore[misc]


def test_resolved_settings_round_trip_to_workers() -> None:
    s = load_settings(parse(["--port", "9999", "--licence-allow", "https://x.example/l"]), env={})
    again = from_resolved_env({"AKRELAY__RESOLVED_SETTINGS": s.to_env()})
    assert again.as_dict() == s.as_dict()
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]
    assert isinstance(s.replace(port=1), Settings) and s.replace(port=1).port == 1
