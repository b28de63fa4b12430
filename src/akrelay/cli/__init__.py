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

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="akrelay",
        description="A federated relay and KIP gateway for agent-knowledge/1.0.",
    )
    parser.add_argument("--version", action="version", version=f"akrelay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules():
        module.register(sub)
    return parser


def command_modules() -> tuple[ModuleType, ...]:
    """The modules that contribute subcommands, in help order (a static list: a missing one is an error).

    ``kip`` comes after ``search``: it adds ``--kip`` to search's ``reindex``.
    """
    from akrelay.cli import admin, ask, audit, client, identity, kip, knowledge, kql, peers, search, serve, store

    return (serve, client, admin, store, search, peers, kip, kql, knowledge, identity, ask, audit)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
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
