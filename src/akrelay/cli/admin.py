"""``akrelay withhold`` / ``akrelay unwithhold``: local content policy (Knowledge §7.1).

Withholding hides a retained object from public reads without deleting it, so
its acceptance record (and retry identity) survives. These commands work on
the data directory directly, through the service and the store interface; a
running relay sees the change on its next read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from akrelay.cli.store import add_store_arguments, store_values
from akrelay.protocol.errors import ProtocolError


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, hidden, text in (
        ("withhold", True, "hide a retained event from public reads (lookup not_found, omitted from queries, "
                           "missing in batch) without deleting it"),
        ("unwithhold", False, "make a withheld event publicly readable again (it keeps its seq)"),
    ):
        parser = subparsers.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("event_id", metavar="EVENT_ID", help="the event ID (envelope hash; after `--` if it starts with '-')")
        parser.add_argument("--data", default=None, metavar="DIR",
                            help="data directory of the relay [env AKRELAY_DATA; default ./akrelay-data]")
        add_store_arguments(parser)
        parser.set_defaults(handler=_run, withheld=hidden)

    parser = subparsers.add_parser(
        "backup", help="copy the relay's SQLite store to a file while it keeps serving",
        description="Online backup (SQLite backup API) of DIR/relay.sqlite3 to OUTPUT: a consistent snapshot "
                    "taken while the relay serves. The TLS files are not included (regenerated or kept by you).")
    parser.add_argument("output", metavar="OUTPUT", help="backup file to create")
    parser.add_argument("--data", default=None, metavar="DIR", help="data directory [default ./akrelay-data]")
    parser.set_defaults(handler=_backup)

    parser = subparsers.add_parser(
        "restore", help="restore a backup into a data directory, keeping the seq high-water mark",
        description="Replace DIR/relay.sqlite3 with BACKUP (stop the relay first). The restored sequence "
                    "high-water mark is the largest of the backup's, the replaced store's and --min-seq, so a "
                    "seq is never reused after a restore (Knowledge §8.3).")
    parser.add_argument("backup", metavar="BACKUP", help="file written by `akrelay backup`")
    parser.add_argument("--data", default=None, metavar="DIR", help="data directory [default ./akrelay-data]")
    parser.add_argument("--min-seq", type=int, default=0, metavar="N",
                        help="raise the high-water mark to at least N (use the last seq you know was issued "
                             "when the replaced store is lost)")
    parser.set_defaults(handler=_restore)


def _run(args: argparse.Namespace) -> int:
    from akrelay.node import RelayNode
    from akrelay.settings import SettingsError, load_settings

    try:
        settings = load_settings({"data": args.data, **store_values(args)})
    except SettingsError as exc:
        print(f"akrelay {args.command}: {exc}", file=sys.stderr)
        return 2
    if not settings.store and not any(settings.data_dir.glob("*.sqlite3")):
        print(f"akrelay {args.command}: no relay data in {settings.data_dir}", file=sys.stderr)
        return 2
    node = RelayNode.open(settings, components=())
    relay = node.relay
    try:
        record = relay.withhold(args.event_id) if args.withheld else relay.unwithhold(args.event_id)
    except ProtocolError as exc:
        print(f"akrelay {args.command}: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    finally:
        node.stop()
    state = "withheld" if args.withheld else "visible"
    print(json.dumps({"event_id": record.id, "seq": record.seq, "state": state}))
    return 0


STORE_FILE = "relay.sqlite3"


def _data_dir(args: argparse.Namespace) -> Path:
    from akrelay.settings import load_settings

    return load_settings({"data": args.data}).data_dir


def _hwm(path: str | os.PathLike[str]) -> int | None:
    from akrelay.store.sqlite import SqliteStore

    return SqliteStore.probe_high_water_mark(path)


def _backup(args: argparse.Namespace) -> int:
    """SQLite's online backup copies pages under a read transaction: a consistent snapshot."""
    from pathlib import Path

    from akrelay.store.sqlite import SqliteStore

    source = _data_dir(args) / STORE_FILE
    if _hwm(source) is None:
        print(f"akrelay backup: no store at {source}", file=sys.stderr)
        return 2
    out = Path(args.output)
    if out.exists():
        print(f"akrelay backup: {out} exists", file=sys.stderr)
        return 2
    store = SqliteStore(source)
    try:
        checkpoint = store.backup(out)
    finally:
        store.close()
    print(json.dumps({"backup": str(out), "checkpoint": checkpoint}))
    return 0


def _restore(args: argparse.Namespace) -> int:
    import os
    import shutil
    from pathlib import Path

    from akrelay.store.sqlite import SqliteStore

    backup = Path(args.backup)
    backup_hwm = _hwm(backup)
    if backup_hwm is None:
        print(f"akrelay restore: {backup} is not an akrelay store backup", file=sys.stderr)
        return 2
    data = _data_dir(args)
    data.mkdir(parents=True, exist_ok=True)
    target = data / STORE_FILE
    hwm = max(backup_hwm, _hwm(target) or 0, args.min_seq)
    staging = data / (STORE_FILE + ".restore")
    shutil.copyfile(backup, staging)
    store = SqliteStore(staging)
    try:
        hwm = store.raise_high_water_mark(hwm)
    finally:
        store.close()
    for suffix in ("-wal", "-shm"):  # the replaced store's journal must not meet the restored file
        try:
            os.remove(str(target) + suffix)
        except FileNotFoundError:
            pass
    try:  # closing the staging store checkpoints its WAL; if one remains, it travels with the file
        os.replace(str(staging) + "-wal", str(target) + "-wal")
    except FileNotFoundError:
        pass
    try:
        os.remove(str(staging) + "-shm")
    except FileNotFoundError:
        pass
    os.replace(staging, target)
    print(json.dumps({"restored": str(target), "records_checkpoint": backup_hwm, "high_water_mark": hwm}))
    return 0
