"""The ``akrelay`` command line.

Each area of akrelay owns one module in this package that exposes
``register(subparsers)``; this dispatcher only collects them, so that adding a
command never means editing someone else's code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from akrelay import __version__
from akrelay.store.schema import SchemaVersionError

#: Modules that contribute subcommands, in help order. A missing module is skipped
#: so that the CLI keeps working while an area is still being built.
COMMAND_MODULES = (
    "akrelay.cli.serve",
    "akrelay.cli.client",
    "akrelay.cli.admin",
    "akrelay.cli.search",
    "akrelay.cli.peers",
    "akrelay.cli.kip",
    "akrelay.cli.kql",
    "akrelay.cli.knowledge",
    "akrelay.cli.identity",
    "akrelay.cli.ask",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="akrelay",
        description="A federated relay and KIP gateway for agent-knowledge/1.0.",
    )
    parser.add_argument("--version", action="version", version=f"akrelay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        result = handler(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``akrelay query ... | head``): not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SchemaVersionError as exc:  # a data file from a newer akrelay: say which, not a traceback
        print(f"akrelay: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
