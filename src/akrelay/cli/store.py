"""``akrelay store migrate``: move a SQLite relay's acceptance log into Redis, ``seq`` values preserved.

Also the store flags that every command opening the relay's log accepts
(:func:`add_store_arguments`), so ``withhold``, ``reindex``, ``kip`` and the
others work on a shared Redis log as on the embedded file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akrelay.settings import Settings

#: The settings (``akrelay.settings.OPTIONS``) that say where the log is.
STORE_OPTIONS = ("store", "store_namespace", "accept_weak_durability")

#: Records per atomic append while migrating.
MIGRATE_PAGE = 500


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store``, ``--store-namespace`` and ``--accept-weak-durability``, as ``akrelay serve`` has them."""
    import akrelay.settings  # noqa: F401 - importing it declares the options that OPTIONS holds
    from akrelay.optionkit import OPTIONS

    for name in STORE_OPTIONS:
        opt = OPTIONS[name]
        help_text = f"{opt.help} [env {opt.env}]"
        if opt.kind == "flag":
            parser.add_argument(opt.flag, dest=name, action="store_const", const=True, default=None, help=help_text)
        else:
            parser.add_argument(opt.flag, dest=name, default=None, metavar=opt.metavar, help=help_text)


def store_values(args: argparse.Namespace) -> dict[str, object]:
    """The store flags given on the command line, for ``load_settings``."""
    return {name: getattr(args, name, None) for name in STORE_OPTIONS}


def missing_log(settings: Settings) -> str | None:
    """Why there is no acceptance log to open, or ``None`` (a Redis log is opened, and checked, as it is)."""
    from akrelay.backend import backend_class

    if backend_class(settings).shared:
        return None
    path = settings.data_dir / "relay.sqlite3"
    return None if path.is_file() else f"no relay store in {settings.data_dir} (expected {path}, or give --store)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("store", help="operate on the acceptance log (move it into Redis)",
                                   description="Operations on the relay's acceptance log.")
    sub = parser.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    migrate = sub.add_parser(
        "migrate", help="copy a SQLite relay's log into an empty Redis, keeping every seq",
        description="Copy DIR/relay.sqlite3 into the Redis at --to: every record keeps its seq, accepted_at and "
                    "withheld state, the high-water mark becomes the SQLite one (so the seq of a removed record is "
                    "never reused) and the cursor secret is copied (cursors issued before keep working). Stop the "
                    "relay first; the target namespace must be empty. Then serve with --store URL.")
    migrate.add_argument("--data", default=None, metavar="DIR",
                         help="data directory of the SQLite relay [default ./akrelay-data]")
    migrate.add_argument("--to", required=True, metavar="URL", help="the Redis log: redis://HOST:PORT/DB")
    migrate.add_argument("--store-namespace", dest="store_namespace", default=None, metavar="NAME",
                         help="key prefix of the deployment in Redis [default akrelay]")
    migrate.add_argument("--accept-weak-durability", dest="accept_weak_durability", action="store_const", const=True,
                         default=None, help="copy even into a Redis without appendonly=yes and appendfsync=always")
    migrate.set_defaults(handler=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from akrelay.backend import backend_class
    from akrelay.settings import SettingsError, load_settings

    try:
        settings = load_settings({"data": args.data, "store": args.to, "store_namespace": args.store_namespace,
                                  "accept_weak_durability": args.accept_weak_durability})
        shared = backend_class(settings).shared
    except SettingsError as exc:
        print(f"akrelay store migrate: {exc}", file=sys.stderr)
        return 2
    if not shared:
        print("akrelay store migrate: --to must be a redis:// URL", file=sys.stderr)
        return 2
    source_path = settings.data_dir / "relay.sqlite3"
    if not source_path.is_file():
        print(f"akrelay store migrate: no SQLite relay store at {source_path}", file=sys.stderr)
        return 2
    try:
        summary = migrate(source_path, settings.store, namespace=settings.store_namespace,
                          accept_weak_durability=settings.accept_weak_durability)
    except MigrationRefused as exc:
        print(f"akrelay store migrate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


class MigrationRefused(RuntimeError):
    """The target is not empty, or the source changed while it was copied."""


def migrate(source_path: str | os.PathLike[str], url: str, *, namespace: str = "akrelay",
            accept_weak_durability: bool = False) -> dict[str, str | int]:
    """Copy the SQLite log at ``source_path`` into the empty Redis namespace; a summary of what was copied."""
    from akrelay.relay.core import CURSOR_SECRET_KEY
    from akrelay.store.redis.store import RedisStore, check_durability
    from akrelay.store.redis.client import describe
    from akrelay.store.sqlite import SqliteStore

    source = SqliteStore(source_path)
    target = RedisStore(url, namespace=namespace)
    try:
        check_durability(target, accept_weak=accept_weak_durability)
        if target.checkpoint() != 0 or target.iter_records(0, 1):
            raise MigrationRefused(f"{describe(url)} namespace {namespace!r} already holds a log (checkpoint "
                                   f"{target.checkpoint()}); migrate only into an empty one")
        checkpoint = source.checkpoint()
        copied = 0
        after = 0
        while page := [r for r in source.iter_records(after, MIGRATE_PAGE) if r.seq <= checkpoint]:
            target.append_records(page)
            copied += len(page)
            after = page[-1].seq
        if source.checkpoint() != checkpoint:
            raise MigrationRefused(f"the relay in {source_path} accepted events during the copy (checkpoint "
                                   f"{checkpoint} -> {source.checkpoint()}); stop it, empty the target and migrate again")
        mark = target.raise_high_water_mark(checkpoint)
        secret = source.meta_get(CURSOR_SECRET_KEY)
        if secret is not None:
            target.meta_set(CURSOR_SECRET_KEY, secret)
        return {"from": str(source_path), "to": describe(url), "namespace": namespace, "records": copied,
                "checkpoint": mark}
    finally:
        target.close()
        source.close()
