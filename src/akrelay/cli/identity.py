"""``akrelay identity``: the Agent Identity core on local files.

Canonical bytes, event IDs and signature checks for envelopes of any Agent
Protocol, computed by exactly the code the relay runs, so a signer can check
its own output before sending it anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from akrelay.protocol.agent_id import agent_id_from_public_key
from akrelay.protocol.b64 import b64decode_canonical
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import parse_strict

# JCS, envelopes and signing are imported by the command that runs them (``akrelay --help``
# loads none of their dependencies; issue 25).


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "identity",
        help="Agent Identity tools: JCS bytes, event IDs, envelope checks, Agent IDs",
        description="Agent Identity 1.0 on local files, with the relay's own protocol core.",
    )
    sub = parser.add_subparsers(dest="identity_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser("jcs", help="print the RFC 8785 canonical form of a strict JSON file ('-' = stdin)")
    p.add_argument("file")
    p.set_defaults(handler=cmd_jcs)

    p = sub.add_parser("hash", help="print the event ID (base64url SHA3-256 of JCS) of an event file")
    p.add_argument("file")
    p.set_defaults(handler=cmd_hash)

    p = sub.add_parser(
        "verify",
        help="check a signed envelope of any Agent Protocol (closed event, hash, strict Ed25519)",
        description="Identity §6.1 steps 1-5 on one envelope file. Prints the event ID, or the error as JSON "
        "and exits 1. For agent-knowledge/1.0 envelopes use 'akrelay knowledge validate'.",
    )
    p.add_argument("file")
    p.add_argument("--extra-field", action="append", default=[], metavar="NAME",
                   help="a top-level event field the event's protocol defines (repeatable), e.g. room_id")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("agent-id", help="print the Agent ID of a 32-byte seed or public key")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed-hex", help="the Ed25519 seed as 64 hex digits")
    group.add_argument("--public-key", help="the raw public key as canonical base64url")
    p.set_defaults(handler=cmd_agent_id)


def _fail(code: str, message: str) -> int:
    print(json.dumps({"error": {"code": code, "message": message}}), file=sys.stderr)
    return 1


def _load(name: str) -> object:
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise ProtocolError("invalid_request", f"cannot read {name}: {exc.strerror}") from None
    return parse_strict(data)


def _canonical_output(produce: Callable[[], object]) -> int:
    """Run ``produce()`` (which prints), mapping the core's refusals to exit code 1."""
    from akrelay.protocol.jcs import JCSError

    try:
        produce()
    except ProtocolError as exc:
        return _fail(exc.code, exc.message)
    except JCSError as exc:  # pragma: no cover - strict parsing leaves nothing JCS refuses
        return _fail("invalid_event", str(exc))
    return 0


def cmd_jcs(args: argparse.Namespace) -> int:
    from akrelay.protocol.jcs import canonicalize

    return _canonical_output(lambda: sys.stdout.buffer.write(canonicalize(_load(args.file)) + b"\n"))


def cmd_hash(args: argparse.Namespace) -> int:
    from akrelay.protocol.envelope import event_hash

    return _canonical_output(lambda: print(event_hash(_load(args.file))))


def cmd_verify(args: argparse.Namespace) -> int:
    from akrelay.protocol.envelope import validate_event_fields, verify_hash_and_signature

    try:
        envelope = _load(args.file)
        if not isinstance(envelope, dict):
            raise ProtocolError("invalid_event", "envelope must be a JSON object")
        validate_event_fields(envelope.get("event"), args.extra_field)
        print(verify_hash_and_signature(envelope))
    except ProtocolError as exc:
        return _fail(exc.code, exc.message)
    return 0


def cmd_agent_id(args: argparse.Namespace) -> int:
    from akrelay.protocol.signer import Signer

    try:
        if args.seed_hex is not None:
            seed = bytes.fromhex(args.seed_hex)
            if len(seed) != 32:
                raise ValueError("the seed must be 32 bytes (64 hex digits)")
            print(Signer.from_seed(seed).agent_id)
        else:
            key = b64decode_canonical(args.public_key, length=32, code="invalid_request", what="public key")
            print(agent_id_from_public_key(key))
    except ValueError as exc:
        return _fail("invalid_request", str(exc))
    except ProtocolError as exc:
        return _fail(exc.code, exc.message)
    return 0
