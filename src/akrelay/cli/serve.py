"""``akrelay serve``: run the relay over HTTPS on its embedded defaults."""

from __future__ import annotations

import argparse
import sys

from akrelay.optionkit import ENV_PREFIX
from akrelay.settings import SettingsError, add_arguments, load_settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the relay (HTTPS, SQLite store in the data directory)",
        description=(
            "Run the akrelay Knowledge service with Granian over HTTPS. Every option is also settable "
            f"from the environment ({ENV_PREFIX}<OPTION>, e.g. {ENV_PREFIX}PORT=9443) and from a TOML "
            "file given with --config; precedence is flag > environment > file > default. On first "
            "start a self-signed certificate covering localhost, 127.0.0.1 and the origin host is "
            "created in the data directory and its path is printed."
        ),
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from akrelay.process.launcher import serve

    try:
        settings = load_settings(args)
        serve(settings)
    except SettingsError as exc:
        print(f"akrelay serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
