"""What a newcomer meets first: the README's tour, the example payloads, TLS trust and the help texts.

The tour's command block runs line by line through the CLI against a served relay, in a
directory laid out as the README assumes (``docs/examples/`` beside ``akrelay-data/``), so
neither the tour nor the examples can rot unnoticed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from relay_harness import start_relay

from akrelay.cli import main
from akrelay.protocol import payload as payload_rules
from akrelay.protocol.query import PARAMETER_NAMES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _no_client_env(monkeypatch):
    """The CLI reads AKRELAY_RELAY/AKRELAY_CACERT; a developer's shell must not decide these tests."""
    for name in ("AKRELAY_RELAY", "AKRELAY_CACERT", "AKRELAY_DATA"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory):
    """A working directory as the README's tour expects it, with a relay serving akrelay-data/."""
    home = tmp_path_factory.mktemp("tour")
    shutil.copytree(EXAMPLES, home / "docs" / "examples")
    relay = start_relay(home / "akrelay-data")
    yield home, relay
    relay.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tour_lines() -> list[str]:
    section = README.split("## A first tour", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the tour has a command block"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tour_dir, capsys, monkeypatch) -> None:
    home, relay = tour_dir
    monkeypatch.chdir(home)
    lines = tour_lines()
    assert lines[0].startswith("R="), "the tour starts by naming the relay"
    relay_args = shlex.split(shlex.split(lines[0])[0][2:])
    assert relay_args == ["--relay", "https://localhost:8443", "--cacert", "akrelay-data/tls-cert.pem"]
    relay_args[1] = relay.origin  # the test relay has a port of its own
    ids: dict[str, str] = {}
    placeholders = {"<event-id>": "publish", "<assessment-id>": "assess"}
    for line in lines[1:]:
        argv = shlex.split(line, comments=True)
        assert argv[0] == "akrelay", line
        argv = [a for arg in argv[1:] for a in (relay_args if arg == "$R" else [arg])]
        # a command that takes the relay's URL as its argument (audit) names the tour's relay too
        argv = [relay.origin if a == "https://localhost:8443" else a for a in argv]
        for placeholder, kind in placeholders.items():
            argv = [a.replace(placeholder, ids[kind]) if placeholder in a else a for a in argv]
        code, out, err = run(capsys, *argv)
        assert code == 0, f"{line}\n{err}"
        assert "Traceback" not in err
        if argv[0] == "sign":
            ids[argv[1]] = json.loads(out)["hash"]
            assert re.fullmatch(r"[A-Za-z0-9_-]{43}", ids[argv[1]])
        if argv[0] == "submit":
            envelope = json.loads(Path(argv[1]).read_text())
            assert json.loads(out)["envelope"] == envelope
    assert set(ids) == {"publish", "assess", "retract"}, "the tour signs one event of each kind"
    # What the tour said it would find is there.
    code, out, _ = run(capsys, "query", *relay_args, "q=cache", "kind=observation")
    assert json.loads(out.splitlines()[-1])["count"] == 1
    code, out, _ = run(capsys, "query", *relay_args, f"target={ids['assess']}")
    assert [json.loads(line)["envelope"]["hash"] for line in out.splitlines()[:-1]] == [ids["retract"]]


def test_the_readme_commands_are_what_ci_runs() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first, second = re.findall(r"```sh\n(.*?)\n```", quick, re.S)
    assert first == "pip install . && akrelay serve"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert f"{second} || status=$?" in ci, "CI runs the README's test command verbatim"
    assert any(line.startswith("export CI=1") for line in ci), "hypothesis runs derandomised"
    assert any(line.startswith("python3 -m venv ") for line in ci), "in a fresh venv of its own"
    for check in ("python3 -m ruff check src tests", "python3 -m mypy"):
        assert f"{check} || status=$?" in ci, f"CI also runs {check} and fails if it fails"


@pytest.mark.parametrize("kind", ["publish", "assess", "retract"])
def test_each_example_is_a_complete_payload_of_its_kind(kind) -> None:
    """Every required member is present; only the target needs filling in (with --target)."""
    payload = json.loads((EXAMPLES / f"{kind}.json").read_text(encoding="utf-8"))
    if kind != "publish":
        assert not payload_rules.is_canonical_id(payload["target"]), "a placeholder, not somebody's event"
        payload["target"] = "A" * 43
    payload_rules.check_payload_structure(f"knowledge.{kind}", payload)


def test_sign_explains_a_missing_target_and_keeps_the_nonce(tmp_path, capsys) -> None:
    key = tmp_path / "me.key"
    assert run(capsys, "keygen", str(key))[0] == 0
    code, out, err = run(capsys, "sign", "assess", str(EXAMPLES / "assess.json"), "--key", str(key))
    assert code == 2 and out == ""
    assert "--target EVENT_ID" in err and "hash" in err
    assert not Path(str(key) + ".nonce").exists(), "a refused payload uses up no nonce"
    code, _, err = run(capsys, "sign", "publish", str(EXAMPLES / "publish.json"), "--key", str(key),
                       "--target", "A" * 43)
    assert code == 2 and "--target is for assess and retract" in err
    code, _, err = run(capsys, "sign", "retract", str(EXAMPLES / "retract.json"), "--key", str(key),
                       "--target", "not-an-id")
    assert code == 2 and "is not an event ID" in err
    code, out, err = run(capsys, "sign", "retract", str(EXAMPLES / "retract.json"), "--key", str(key),
                         "--target=-" + "A" * 42)
    assert code == 0, err
    assert json.loads(out)["event"]["payload"]["target"] == "-" + "A" * 42


# -- TLS trust --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("command", [["query"], ["get", "--", "A" * 43], ["search", "cache"],
                                     ["kql", 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule"} }']])
def test_an_untrusted_certificate_names_the_cacert_way_out(tour_dir, capsys, command) -> None:
    _, relay = tour_dir
    code, out, err = run(capsys, command[0], "--relay", relay.origin, *command[1:])
    assert code in (1, 2) and out == ""
    assert "certificate verification failed" in err and "self-signed certificate" in err
    assert "hint: pass --cacert with the path of the relay's certificate (akrelay-data/tls-cert.pem" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_a_cacert_of_another_relay_is_named_in_the_hint(tour_dir, tmp_path, capsys) -> None:
    from akrelay.tls import ensure_self_signed

    _, relay = tour_dir
    other = ensure_self_signed(tmp_path, relay.origin).cert
    code, out, err = run(capsys, "query", "--relay", relay.origin, "--cacert", str(other))
    assert code == 2 and out == ""
    assert f"does not verify against --cacert {other}" in err and "tls-cert.pem" in err


@pytest.mark.parametrize("command", [["query"], ["search", "cache"], ["kip", "DESCRIBE PRIMER"]])
def test_an_unusable_cacert_file_is_a_message_not_a_traceback(tmp_path, capsys, command) -> None:
    missing = tmp_path / "missing.pem"
    not_pem = tmp_path / "payload.json"
    not_pem.write_text("{}")
    for cacert, says in ((missing, "cannot read --cacert"), (not_pem, "holds no PEM certificate")):
        code, out, err = run(capsys, *command, "--relay", "https://localhost:1", "--cacert", str(cacert))
        assert code in (1, 2) and out == "", err
        assert says in err and str(cacert) in err


# -- help texts -------------------------------------------------------------------------------------


def help_of(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines; compare words


def test_submit_help_says_what_it_does(capsys) -> None:
    text = help_of(capsys, "submit")
    assert "acceptance record" in text and "seq" in text and "akrelay sign" in text


def test_query_help_lists_every_parameter(capsys) -> None:
    text = help_of(capsys, "query")
    for name in PARAMETER_NAMES - {"cursor"}:
        assert re.search(rf"(^| ){name} ", text), name
    assert "observation" in text and "knowledge.assess" in text  # the closed vocabularies too


def test_sign_help_describes_the_payload(capsys) -> None:
    text = help_of(capsys, "sign")
    required = {"publish": payload_rules._PUBLISH_REQUIRED, "assess": payload_rules._ASSESS_REQUIRED,
                "retract": ("license", "target", "reason")}
    for kind, members in required.items():
        part = text.split(f" {kind} required:", 1)[1].split("Optional", 1)[0]
        for member in members:
            assert member in part, (kind, member)
    assert "docs/examples/" in text and "--target" in text and '"hash"' in text
    for kind in payload_rules.KINDS | payload_rules.VERDICTS:
        assert kind in text


def test_sync_help_offers_no_serve_only_flags(capsys) -> None:
    from akrelay.settings import OPTIONS

    text = help_of(capsys, "sync")
    for opt in OPTIONS.values():
        assert (opt.flag + " " in text) != opt.serve_only, opt.flag
    for flag in ("--host", "--port", "--workers", "--tls-cert", "--write-rate", "--read-rate"):
        assert flag + " " not in text
    assert "--peers" in text and "--data" in text and "--once" in text
    with pytest.raises(SystemExit):
        main(["sync", "--port", "9443"])  # refused, not silently ignored
    assert "unrecognized arguments: --port" in capsys.readouterr().err


def test_serve_help_still_offers_every_option(capsys) -> None:
    from akrelay.settings import OPTIONS

    text = help_of(capsys, "serve")
    for opt in OPTIONS.values():
        assert opt.flag + " " in text, opt.flag


def test_kip_reindex_is_a_described_alias_of_reindex_kip(capsys) -> None:
    text = help_of(capsys, "kip-reindex")
    assert "Alias of `akrelay reindex --kip`" in text
    assert "--data DIR the relay's data directory" in text and "--origin ORIGIN the relay origin" in text
    assert "--kip" in help_of(capsys, "reindex")


def test_batch_and_get_help_say_to_use_double_dash(capsys) -> None:
    for command in ("batch", "get"):
        assert "`--`" in help_of(capsys, command)
