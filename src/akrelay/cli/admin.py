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


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        description="Replace DIR/relay.sqlite3 with BACKUP. Refused while the relay runs (any process with the "
                    "store open). The restored sequence high-water mark is the largest of the backup's, the "
                    "replaced store's, the bound kept beside it in DIR/relay.sqlite3.hwm and --min-seq, so a "
                    "seq is never reused after a restore (Knowledge §8.3).")
    parser.add_argument("backup", metavar="BACKUP", help="file written by `akrelay backup`")
    parser.add_argument("--data", default=None, metavar="DIR", help="data directory [default ./akrelay-data]")
    parser.add_argument("--min-seq", type=int, default=0, metavar="N",
                        help="raise the high-water mark to at least N (use the last seq you know was issued "
                             "when the replaced store is lost)")
    parser.set_defaults(handler=_restore)


def _run(args: argparse.Namespace) -> int:
    from akrelay.backend import backend_class
    from akrelay.node import RelayNode
    from akrelay.settings import SettingsError, load_settings

    try:
        settings = load_settings({"data": args.data, **store_values(args)})
    except SettingsError as exc:
        print(f"akrelay {args.command}: {exc}", file=sys.stderr)
        return 2
    if not backend_class(settings).shared and not any(settings.data_dir.glob("*.sqlite3")):
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
    """Refused while any process has the store open; the restored mark is above every seq handed out."""
    from akrelay.store.sqlite_guard import try_exclusive_open_lock

    backup = Path(args.backup)
    backup_hwm = _hwm(backup)
    if backup_hwm is None:
        print(f"akrelay restore: {backup} is not an akrelay store backup", file=sys.stderr)
        return 2
    data = _data_dir(args)
    data.mkdir(parents=True, exist_ok=True)
    target = data / STORE_FILE
    guard = try_exclusive_open_lock(target)
    if guard is None:
        print(f"akrelay restore: the relay is running on {data} (a process has {STORE_FILE} open: `akrelay serve`, "
              "its followers or another akrelay command); stop it first. Nothing was changed: a running relay "
              "would keep writing to the replaced file, and what it acknowledged would be lost.", file=sys.stderr)
        return 1
    try:
        return _swap_in(backup, backup_hwm, target, max(_floor(target), args.min_seq))
    finally:
        os.close(guard)  # a relay starting meanwhile waited for this, and opens the restored file


def _floor(target: Path) -> int:
    """Above every seq handed out: the replaced store's mark while it agrees with the bound kept beside it.

    The bound (``relay.sqlite3.hwm``) is at most :data:`~akrelay.store.sqlite_guard.RESERVE_BLOCK`
    above the last seq handed out; a replaced file below that (lost, unreadable, an older copy) is
    not trusted, and the bound is used instead (a gap, never a reuse).
    """
    from akrelay.store.sqlite_guard import RESERVE_BLOCK, read_reserved

    found, reserved = _hwm(target) or 0, read_reserved(target)
    return found if found >= reserved - RESERVE_BLOCK else reserved


def _swap_in(backup: Path, backup_hwm: int, target: Path, floor: int) -> int:
    """Copy ``backup`` next to ``target``, raise its mark to ``floor`` at least, and move it into place."""
    import shutil

    from akrelay.store.sqlite import SqliteStore
    from akrelay.store.sqlite_guard import HWM_SUFFIX, OPEN_LOCK_SUFFIX, SeqReservation

    hwm = max(backup_hwm, floor)
    staging = target.with_name(STORE_FILE + ".restore")
    shutil.copyfile(backup, staging)
    store = SqliteStore(staging)
    try:
        hwm = store.raise_high_water_mark(hwm)
    finally:
        store.close()
    # the target's bound covers the restored mark too (the staging file had its own)
    _remove(f"{staging}{HWM_SUFFIX}", f"{staging}{OPEN_LOCK_SUFFIX}", f"{staging}.write-lock")
    SeqReservation(target).cover(hwm)
    _remove(f"{target}-wal", f"{target}-shm")  # the replaced store's journal must not meet the restored file
    try:  # closing the staging store checkpoints its WAL; if one remains, it travels with the file
        os.replace(f"{staging}-wal", f"{target}-wal")
    except FileNotFoundError:
        pass
    _remove(f"{staging}-shm")
    os.replace(staging, target)
    print(json.dumps({"restored": str(target), "records_checkpoint": backup_hwm, "high_water_mark": hwm}))
    return 0


def _remove(*paths: str) -> None:
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
