"""What a cold start loads (issue 25): deterministic checks of ``sys.modules``, not timings.

``akrelay --help`` and the parser behind every command must import only argparse-level
modules; the serve launcher must not import what only a worker or a follower needs. The
cost of an import is what makes these slow (bench/bench_restart.py measures it); which
modules are imported is what a test can check on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

#: Third-party libraries and akrelay areas that only a running component needs.
HEAVY = ("tantivy", "lark", "jsonschema", "litestar", "granian", "httpx", "redis", "cryptography", "nacl",
         "msgspec", "sqlite3", "anyio", "akrelay.store", "akrelay.relay", "akrelay.node", "akrelay.http",
         "akrelay.kip.nexus", "akrelay.kip.runtime", "akrelay.kip.kql", "akrelay.knowql.engine",
         "akrelay.search.engine", "akrelay.explorer.routes", "akrelay.federation", "akrelay.process.launcher",
         "akrelay.protocol.envelope", "akrelay.protocol.signer")

PROBE = """
import json, sys, contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    try:
        {call}
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded_after(call: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``call``."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(call=call)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def heavy(modules: list[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)
            and not any(m == a or m.startswith(a + ".") for a in allowed)]


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["kql", "--help"], ["search", "--help"],
                                  ["no-such-command"]])
def test_help_and_usage_errors_import_nothing_heavy(argv: list[str]) -> None:
    modules = loaded_after(f"from akrelay.cli import main; main({argv!r})")
    assert "akrelay.cli" in modules
    assert heavy(modules) == []


def test_settings_of_every_component_load_without_the_components() -> None:
    """The options of every area are declared by light ``options`` modules (the launcher reads them all)."""
    modules = loaded_after("from akrelay.settings import load_option_modules; load_option_modules()")
    assert "akrelay.search.options" in modules and "akrelay.kip.options" in modules
    assert heavy(modules) == []


def test_lazy_package_exports_still_resolve() -> None:
    """``from akrelay.kip import KipConfig`` and ``from akrelay.search import SearchEngine`` load on first use."""
    modules = loaded_after("from akrelay.kip import KipConfig, POLICIES; from akrelay.search import SearchEngine, Budget")
    assert "akrelay.kip.config" in modules and "akrelay.search.engine" in modules
    import akrelay.kip

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        akrelay.kip.nothing  # noqa: B018 - the attribute access is the test


def test_top_level_help_and_a_typo_import_no_command_module() -> None:
    """``akrelay --help`` is answered from the static table (``akrelay.cli.COMMANDS``)."""
    for argv in (["--help"], [], ["no-such-command"], ["--version"]):
        modules = loaded_after(f"from akrelay.cli import main; main({argv!r})")
        assert [m for m in modules if m.startswith("akrelay.cli.")] == [], argv


def test_a_command_imports_only_the_modules_that_build_it() -> None:
    modules = loaded_after("from akrelay.cli import main; main(['reindex', '--help'])")
    assert {m for m in modules if m.startswith("akrelay.cli.")} >= {"akrelay.cli.search", "akrelay.cli.kip"}
    assert "akrelay.cli.serve" not in modules and "akrelay.cli.audit" not in modules


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_command_table_says_what_the_modules_register() -> None:
    """Names, help order, one-line help and the modules behind each command, as registered."""
    from akrelay import cli

    full = _subparsers(cli.build_parser())
    assert [(a.dest, a.help) for a in full._choices_actions] == [(name, text) for name, _, text in cli.COMMANDS]
    for name, owners, _ in cli.COMMANDS:
        parser = cli.build_parser(name)
        assert name in _subparsers(parser).choices
        # the light parser of the command is the full one's: same arguments, same defaults
        light, whole = _subparsers(parser).choices[name], full.choices[name]
        assert light.format_help() == whole.format_help()
        assert [a.dest for a in light._actions] == [a.dest for a in whole._actions]
        handlers = (light.get_default("handler"), whole.get_default("handler"))  # None: it has subcommands
        assert len({getattr(h, "__qualname__", None) for h in handlers}) == 1
    owners_of: dict[str, list[str]] = {}
    for module in cli.command_modules():
        sub = argparse.ArgumentParser().add_subparsers()
        module.register(sub)
        for name in sub.choices:
            owners_of.setdefault(name, []).append(module.__name__.rpartition(".")[2])
    assert owners_of == {name: list(owners) for name, owners, _ in cli.COMMANDS}


@pytest.mark.parametrize("argv", [["--help"], [], ["no-such-command"], ["identity"], ["-h", "serve"]])
def test_the_light_parser_answers_as_the_whole_one(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from akrelay import cli

    def answer(run: object) -> tuple[str, str, object]:
        code: object = None
        try:
            code = run()  # type: ignore[operator]
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr()
        return out.out, out.err, code

    def whole() -> object:
        parser = cli.build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "handler", None) is None:
            parser.print_help()
            return 0
        return None

    assert answer(lambda: cli.main(argv)) == answer(whole)
