"""``akrelay knowledge``: offline checks with the Agent Knowledge core.

Everything here runs the same pure functions the relay runs, on local files,
so an agent can check an envelope, a known set or an evidence file before (or
without) talking to a service.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from akrelay.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from akrelay.protocol.envelope import Envelope

# The checks are imported by the command that runs them (``akrelay --help`` loads none; issue 25).


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("knowledge", help="offline Agent Knowledge checks (validate, view, evidence, terms)",
                                   description="Offline Agent Knowledge checks with the relay's own protocol core.")
    sub = parser.add_subparsers(dest="knowledge_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser("validate", help="validate envelope files in order, resolving targets among them",
                       description="Run acceptance steps 1, 3, 4 and 5 of §8.1 and the recommended limits on each "
                                   "file in order; earlier valid files resolve later targets. Prints one line per file.")
    p.add_argument("files", nargs="+", help="envelope JSON files (one envelope each)")
    p.add_argument("--now-ms", type=int, default=None, help="receiver clock for the future-skew check (skipped if absent)")
    p.add_argument("--no-targets", action="store_true", help="skip dependency and target rules")
    p.add_argument("--strict-retract", action="store_true", help="refuse legacy retractions without license")
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("view", help="print the §7.2 known-set view of envelope files")
    p.add_argument("files", nargs="+")
    p.set_defaults(handler=cmd_view)

    p = sub.add_parser("evidence", help="check a local file against an evidence digest")
    p.add_argument("digest")
    p.add_argument("file", nargs="?", help="the complete representation; omit to report 'unavailable'")
    p.set_defaults(handler=cmd_evidence)

    p = sub.add_parser("terms", help="show the portable text terms of a q value")
    p.add_argument("text")
    p.add_argument("--semantic", action="store_true", help="no 16-term bound (semantic/hybrid search text)")
    p.set_defaults(handler=cmd_terms)


def _error_line(name: str, exc: ProtocolError) -> str:
    body: dict[str, object] = {"file": name, "code": exc.code, "message": exc.message}
    if exc.data is not None:
        body["data"] = exc.data
    return json.dumps(body, ensure_ascii=False)


def cmd_validate(args: argparse.Namespace) -> int:
    from akrelay.protocol.dependencies import check_targets
    from akrelay.protocol.envelope import verify_envelope
    from akrelay.protocol.limits import DEFAULT_LIMITS, check_limits
    from akrelay.protocol.options import ValidationOptions
    from akrelay.protocol.payload import check_payload_rules
    from akrelay.protocol.timestamps import check_created_at

    options = ValidationOptions(allow_legacy_retract=not args.strict_retract)
    known: dict[str, Envelope] = {}
    failures = 0
    for name in args.files:
        try:
            raw = Path(name).read_bytes()
            item = verify_envelope(raw, options=options)
            check_payload_rules(item, options)
            if args.now_ms is not None:
                check_created_at(item, args.now_ms)
            if not args.no_targets:
                check_targets(item, known.get)
            check_limits(item, DEFAULT_LIMITS, envelope_bytes=len(raw))
        except ProtocolError as exc:
            failures += 1
            print(_error_line(name, exc))
            continue
        except OSError as exc:
            failures += 1
            print(json.dumps({"file": name, "code": "unreadable", "message": str(exc)}))
            continue
        known[item.id] = item
        print(json.dumps({"file": name, "code": "valid", "hash": item.id, "type": item.type}))
    return 1 if failures else 0


def cmd_view(args: argparse.Namespace) -> int:
    from akrelay.protocol.envelope import verify_envelope
    from akrelay.protocol.view import materialize

    items = []
    for name in args.files:
        try:
            items.append(verify_envelope(Path(name).read_bytes()))
        except ProtocolError as exc:
            print(_error_line(name, exc), file=sys.stderr)
            return 1
    print(json.dumps(materialize(items), indent=2, sort_keys=True))
    return 0


def cmd_evidence(args: argparse.Namespace) -> int:
    from akrelay.protocol.evidence import verify_evidence

    representation = Path(args.file).read_bytes() if args.file else None
    try:
        status = verify_evidence(args.digest, representation)
    except ProtocolError as exc:
        print(_error_line(args.file or "-", exc), file=sys.stderr)
        return 2
    print(status)
    return 0 if status in ("matched", "unchecked") else 1


def cmd_terms(args: argparse.Namespace) -> int:
    from akrelay.protocol.text import text_terms

    try:
        terms = text_terms(args.text, lexical=not args.semantic)
    except ProtocolError as exc:
        print(_error_line("-", exc), file=sys.stderr)
        return 2
    print(json.dumps(terms, ensure_ascii=False))
    return 0
