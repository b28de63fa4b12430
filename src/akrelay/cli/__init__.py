"""The ``akrelay`` command line.

Each area of akrelay owns one module in this package that exposes
``register(subparsers)``; this dispatcher lists them (:func:`command_modules`).

Building the parser imports only ``argparse``-level modules: each command module
imports what its handler needs when the handler runs, so ``akrelay --help`` and a
typo answer at once (issue 25; ``tests/cli/test_cold_start.py`` keeps it so).
"""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

from akrelay import __version__

#: Every command, in help order: ``(name, the modules that register it, its one-line help)``.
#: ``akrelay --help``, a bare ``akrelay`` and an unknown command are answered from this table alone;
#: a known command imports only the modules that build its parser (issue 25: importing all twelve
#: command modules took most of a cold ``--help``). ``tests/cli/test_cold_start.py`` checks that the
#: table says exactly what the modules register.
COMMANDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("serve", ("serve",), "run the relay (HTTPS, SQLite store in the data directory)"),
    ("keygen", ("client",), "create an Ed25519 agent key file"),
    ("sign", ("client",), "build and sign a publish, assess or retract envelope"),
    ("submit", ("client",), "submit signed envelopes and print their acceptance records"),
    ("get", ("client",), "read one acceptance record by event ID"),
    ("query", ("client",), "enumerate a query completely (every page) and print a final checkpoint"),
    ("batch", ("client",), "read up to 100 event IDs; prints result and missing"),
    ("withhold", ("admin",), "hide a retained event from public reads (lookup not_found, omitted from queries, "
                             "missing in batch) without deleting it"),
    ("unwithhold", ("admin",), "make a withheld event publicly readable again (it keeps its seq)"),
    ("backup", ("admin",), "copy the relay's SQLite store to a file while it keeps serving"),
    ("restore", ("admin",), "restore a backup into a data directory, keeping the seq high-water mark"),
    ("store", ("store",), "operate on the acceptance log (move it into Redis)"),
    ("search", ("search",), "ranked search on a relay (Knowledge §9.5); prints hits and coverage"),
    # search registers reindex, kip adds --kip to it
    ("reindex", ("search", "kip"), "rebuild the search index of a data directory from its store"),
    ("peers", ("peers",), "edit the peer configuration file and show per-peer sync status"),
    ("sync", ("peers",), "replicate from the configured peers (one pass with --once)"),
    ("kip", ("kip",), "run a KIP META/KQL command against the relay's nexus"),
    ("kip-reindex", ("kip",), "alias of `akrelay reindex --kip`: rebuild the KIP nexus"),
    ("kql", ("kql",), "run a KIP KQL query against the relay's nexus"),
    ("knowledge", ("knowledge",), "offline Agent Knowledge checks (validate, view, evidence, terms)"),
    ("identity", ("identity",), "Agent Identity tools: JCS bytes, event IDs, envelope checks, Agent IDs"),
    ("ask", ("ask",), "ask the relay's knowledge a question (KnowQL POST /query); prints a cited answer"),
    ("audit", ("audit",), "verify a relay's signed Merkle log: signature, consistency, and (--full) every record"),
    ("witness", ("audit",), "ask a witness relay to cosign a log's latest checkpoint (C2SP tlog-witness)"),
)
#: The modules that contribute subcommands, in registration order (``kip`` after ``search``).
MODULES = ("serve", "client", "admin", "store", "search", "peers", "kip", "kql", "knowledge", "identity", "ask",
           "audit")
#: Top-level options that answer without a command (argparse acts on them before the command).
_ANSWERED_HERE = frozenset(("-h", "--help", "--version"))


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="akrelay",
        description="A federated relay and KIP gateway for agent-knowledge/1.0.",
    )
    parser.add_argument("--version", action="version", version=f"akrelay {__version__}")
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``command``, the light parser :func:`main` uses for it.

    The light parser of a known command registers only the modules that build it (its usage and its
    errors are those of its own subparser); that of no command or an unknown one lists every
    command from :data:`COMMANDS` without building any, so the top-level help and the error for a
    typo are those of the whole parser.
    """
    parser, sub = _top_parser()
    if command is None:
        for module in command_modules():
            module.register(sub)
        return parser
    owners = next((modules for name, modules, _ in COMMANDS if name == command), ())
    for module in command_modules(owners):
        module.register(sub)
    if not owners:
        for name, _, text in COMMANDS:
            sub.add_parser(name, help=text)
    return parser


def command_modules(names: tuple[str, ...] | None = None) -> tuple[ModuleType, ...]:
    """The modules that contribute subcommands, in registration order (a static list: a missing one is an error).

    ``names`` keeps only those (``None``: all of them; ``()``: none). ``kip`` comes after ``search``: it adds
    ``--kip`` to search's ``reindex``.
    """
    from importlib import import_module

    wanted = MODULES if names is None else tuple(m for m in MODULES if m in names)
    return tuple(import_module(f"akrelay.cli.{name}") for name in wanted)


def _command_of(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word), or ``None`` when argparse answers before any command."""
    for word in argv:
        if word in _ANSWERED_HERE:
            return None
        if not word.startswith("-"):
            return word
    return None


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = _command_of(words)
    parser = build_parser(command or "")
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None:  # no command, or one whose subcommand is missing (``akrelay identity``)
        (parser if command is None else build_parser("")).print_help()
        return 0
    # after parsing: --help and usage errors exit above without loading the store
    from akrelay.settings import SettingsError
    from akrelay.store.base import StoreRefused, StoreUnavailable
    from akrelay.store.schema import SchemaVersionError

    try:
        result = handler(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``akrelay query ... | head``): not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (SchemaVersionError, StoreRefused, StoreUnavailable, SettingsError) as exc:
        # a data file from a newer akrelay, a Redis too weak or unreachable, a --store no backend serves
        # (found when the backend is chosen): say which, not a traceback
        print(f"akrelay: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
