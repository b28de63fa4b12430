"""``akrelay withhold`` / ``akrelay unwithhold``: local content policy (Knowledge §7.1).

Withholding hides a retained object from public reads without deleting it, so
its acceptance record (and retry identity) survives. These commands work on
the data directory directly, through the service and the store interface; a
running relay sees the change on its next read.
"""

from __future__ import annotations

import argparse
import json
import sys

from akrelay.protocol.errors import ProtocolError


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, hidden, text in (
        ("withhold", True, "hide a retained event from public reads (lookup not_found, omitted from queries, "
                           "missing in batch) without deleting it"),
        ("unwithhold", False, "make a withheld event publicly readable again (it keeps its seq)"),
    ):
        parser = subparsers.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("event_id", metavar="EVENT_ID", help="the event ID (envelope hash)")
        parser.add_argument("--data", default=None, metavar="DIR",
                            help="data directory of the relay [env AKRELAY_DATA; default ./akrelay-data]")
        parser.set_defaults(handler=_run, withheld=hidden)


def _run(args: argparse.Namespace) -> int:
    from akrelay.server import open_relay_for
    from akrelay.settings import SettingsError, load_settings

    try:
        settings = load_settings({"data": args.data})
    except SettingsError as exc:
        print(f"akrelay {args.command}: {exc}", file=sys.stderr)
        return 2
    if not (settings.data_dir / "relay.sqlite3").exists() and not any(settings.data_dir.glob("*.sqlite3")):
        print(f"akrelay {args.command}: no relay data in {settings.data_dir}", file=sys.stderr)
        return 2
    relay = open_relay_for(settings)
    try:
        record = relay.withhold(args.event_id) if args.withheld else relay.unwithhold(args.event_id)
    except ProtocolError as exc:
        print(f"akrelay {args.command}: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    finally:
        relay.close()
    state = "withheld" if args.withheld else "visible"
    print(json.dumps({"event_id": record.id, "seq": record.seq, "state": state}))
    return 0
