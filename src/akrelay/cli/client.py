"""Client commands: ``keygen``, ``sign``, ``submit``, ``get``, ``query``, ``batch``.

Every command that talks to a relay goes through :class:`akrelay.client.RelayClient`,
so each received envelope is verified and a response naming another service
is refused. Output is JSON on stdout; errors go to stderr with a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from akrelay.cli.terminal import printable
from akrelay.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from akrelay.client import AcceptanceRecord, RelayClient
    from akrelay.jsontypes import JSON, JSONObject
    from akrelay.protocol.signer import NonceClock, Signer

DEFAULT_RELAY = "https://localhost:8443"
EVENT_TYPES = ("publish", "assess", "retract")

# Exit codes: 1 the relay refused (spec error), 2 usage or local input error, 3 bad response.
EXIT_REFUSED, EXIT_USAGE, EXIT_RESPONSE = 1, 2, 3


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps prose as usual but keeps a text laid out in lines (a table in the epilog) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _query_epilog() -> str:
    """Every §9.3 parameter, from the protocol core's own list, so the help cannot fall behind it."""
    import textwrap

    from akrelay.protocol.payload import EVENT_TYPES as TYPES, KINDS, RELATIONS, VERDICTS
    from akrelay.protocol.query import FILTER_NAMES, MAX_LIMIT, PARAMETER_NAMES

    meaning = {
        "actor": "a did:agent: ID (the signer)",
        "type": " | ".join(sorted(TYPES)),
        "kind": " | ".join(sorted(KINDS)),
        "target": "an event ID: assessments and retractions of it, publications related to it",
        "relation": " | ".join(sorted(RELATIONS)),
        "tag": "one tag, e.g. caching",
        "profile": "an application profile digest",
        "language": "a language tag, e.g. en",
        "verdict": " | ".join(sorted(VERDICTS)),
        "created_from": "created_from <= created_at (Unix milliseconds)",
        "created_before": "created_at < created_before (Unix milliseconds)",
        "q": "text: each whitespace-separated term (1-16) is a substring of a text field (ASCII case folded)",
        "after_seq": "only records accepted after this seq (a checkpoint printed earlier)",
        "limit": f"records per page, 1-{MAX_LIMIT} (every page is fetched anyway)",
    }
    names = [n for n in (*FILTER_NAMES, *meaning) if n in PARAMETER_NAMES]
    names = list(dict.fromkeys(names))
    names += sorted(PARAMETER_NAMES - set(names) - {"cursor"})  # one the core adds later is listed by name
    width = max(map(len, names))
    lines = ["query parameters (NAME=VALUE, each at most once):"]
    for name in names:
        lines += textwrap.wrap(meaning.get(name, "see Agent Knowledge 1.0 section 9.3"), 92,
                               initial_indent=f"  {name:<{width}}  ",
                               subsequent_indent=" " * (width + 4), break_on_hyphens=False)
    lines.append("(cursor is not taken: the command follows next_cursor itself.)")
    return "\n".join(lines)


def _sign_epilog() -> str:
    """What a payload holds, so that a first payload does not take one refusal per missing member."""
    import textwrap

    from akrelay.protocol.payload import KINDS, VERDICTS

    def wrapped(label: str, text: str) -> list[str]:
        return textwrap.wrap(text, 92, initial_indent=f"  {label:<8} ", subsequent_indent=" " * 11,
                             break_on_hyphens=False)

    return "\n".join([
        "the payload: a closed JSON object (Agent Knowledge 1.0 sections 4-7); unknown members are refused.",
        *wrapped("publish", "required: license (https URL), kind, title, statement, language (e.g. en), "
                            "context {scope, conditions: [...], limitations: [...]}, basis. "
                            "Optional: evidence, reproduction, relations, tags, profiles, extra. "
                            "kind: " + ", ".join(sorted(KINDS)) + "."),
        *wrapped("assess", "required: license, target (event ID of a publish), verdict, summary, context, "
                           "basis. Optional: evidence, reproduction, profiles, extra. "
                           "verdict: " + ", ".join(sorted(VERDICTS)) + "; reproduced, not_reproduced and "
                           "applied need reproduction.observed."),
        *wrapped("retract", "required: license, target (event ID of your own earlier publish or assess), "
                            "reason. Optional: extra."),
        "examples: docs/examples/publish.json, assess.json and retract.json in the source tree.",
        "The event ID of an envelope is its \"hash\" (printed with -o); pass it to assess and retract",
        "with --target, which replaces the example's placeholder.",
    ])


def relay_args(parser: argparse.ArgumentParser) -> None:
    """``--relay`` and ``--cacert``, as every command that talks to a running relay takes them."""
    parser.add_argument("--relay", default=os.environ.get("AKRELAY_RELAY", DEFAULT_RELAY), metavar="URL",
                        help=f"relay origin [env AKRELAY_RELAY; default {DEFAULT_RELAY}]")
    parser.add_argument("--cacert", default=os.environ.get("AKRELAY_CACERT"), metavar="PEM",
                        help="PEM certificate to trust, e.g. the relay's self-signed tls-cert.pem [env AKRELAY_CACERT]")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("keygen", help="create an Ed25519 agent key file",
                              description="Create an Ed25519 key file (JSON, mode 0600) and print its Agent ID.")
    p.add_argument("key", metavar="KEY_FILE", help="path of the key file to create")
    p.add_argument("--force", action="store_true", help="overwrite an existing key file")
    p.set_defaults(handler=_guard(cmd_keygen))

    p = subparsers.add_parser("sign", help="build and sign a publish, assess or retract envelope",
                              formatter_class=_HelpFormatter,
                              description="Build a knowledge.<TYPE> event from a payload JSON file, sign it with "
                                          "KEY_FILE and print the envelope (or, with -o, its event ID as \"hash\"). "
                                          "The nonce is max(last + 1, created_at), kept in KEY_FILE.nonce.",
                              epilog=_sign_epilog())
    p.add_argument("type", choices=EVENT_TYPES, metavar="TYPE", help="publish | assess | retract")
    p.add_argument("payload", metavar="PAYLOAD_JSON",
                   help="the payload object, a file ('-' for stdin); examples in docs/examples/")
    p.add_argument("--key", required=True, metavar="KEY_FILE", help="key file from `akrelay keygen`")
    p.add_argument("--target", default=None, metavar="EVENT_ID",
                   help="assess/retract: set payload.target to this event ID (write --target=ID if it starts "
                        "with '-')")
    p.add_argument("--created-at", type=int, default=None, metavar="MS", help="event time (default: now)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="write the envelope here and print {\"hash\": EVENT_ID, \"output\": FILE} "
                        "(default: print the envelope)")
    p.set_defaults(handler=_guard(cmd_sign))

    p = subparsers.add_parser("submit", help="submit signed envelopes and print their acceptance records",
                              description="POST each signed envelope (from `akrelay sign`) to the relay's events "
                                          "endpoint, in order, and print one acceptance record per envelope: "
                                          "{\"envelope\", \"seq\", \"accepted_at\"}. Submitting an accepted "
                                          "envelope again returns its existing record. Stops at the first refusal "
                                          "(exit 1, the relay's error code on stderr).")
    p.add_argument("envelopes", nargs="+", metavar="ENVELOPE_JSON", help="envelope files ('-' for stdin)")
    p.add_argument("--prove", action="store_true", help="also verify each record's inclusion in the signed Merkle log")
    relay_args(p)
    p.set_defaults(handler=_guard(cmd_submit))

    p = subparsers.add_parser("get", help="read one acceptance record by event ID",
                              description="Read the acceptance record of one event and verify its envelope. The "
                                          "event ID is the envelope's \"hash\" (what `akrelay sign` prints).")
    p.add_argument("event_id", metavar="EVENT_ID", help="event ID (put it after `--` if it starts with '-')")
    p.add_argument("--prove", action="store_true", help="also verify the record's inclusion in the signed Merkle log")
    relay_args(p)
    p.set_defaults(handler=_guard(cmd_get))

    p = subparsers.add_parser("query", help="enumerate a query completely (every page) and print a final checkpoint",
                              formatter_class=_HelpFormatter,
                              description="Run a §9.3 query, following every page. Prints one acceptance record "
                                          "per line, then a final line {\"checkpoint\", \"as_of\", \"service\", "
                                          "\"count\", \"pages\"}; pass that checkpoint as after_seq=N next time "
                                          "to follow new records.",
                              epilog=_query_epilog())
    p.add_argument("params", nargs="*", metavar="NAME=VALUE",
                   help="query parameters (listed below), combined with AND, e.g. kind=observation q=\"cache language\"")
    relay_args(p)
    p.set_defaults(handler=_guard(cmd_query))

    p = subparsers.add_parser("batch", help="read up to 100 event IDs; prints result and missing",
                              description="Read up to 100 acceptance records by event ID in one request. Prints "
                                          "{\"result\", \"missing\", ...}: found records and unknown IDs, each in "
                                          "request order. Put the IDs after `--`, since an event ID may start with '-'.")
    p.add_argument("event_ids", nargs="+", metavar="EVENT_ID", help="event IDs (after `--` if one starts with '-')")
    relay_args(p)
    p.set_defaults(handler=_guard(cmd_batch))


def _guard(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Local input errors abort with exit code 2 and a message, never a traceback.

    A ``ProtocolError`` from a local check is reported with its code, as a relay would report it.
    """
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        except ProtocolError as exc:
            return _fail(f"{exc.code}: {exc.message}")
    run.__name__ = command.__name__
    return run


# -- keys and signing -------------------------------------------------------------------


def _write_private(path: Path, text: str, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def load_signer(path: str | os.PathLike[str]) -> Signer:
    from akrelay.protocol.b64 import b64decode_canonical
    from akrelay.protocol.signer import Signer

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        seed = b64decode_canonical(doc["seed"], length=32, code="invalid_request")
    except (OSError, ValueError, KeyError, TypeError, ProtocolError) as exc:
        raise SystemExit(_fail(f"cannot read key file {path}: {exc}"))
    signer = Signer.from_seed(seed)
    if doc.get("agent_id") not in (None, signer.agent_id):
        raise SystemExit(_fail(f"key file {path}: agent_id does not match the seed"))
    return signer


def cmd_keygen(args: argparse.Namespace) -> int:
    import secrets

    from akrelay.protocol.b64 import b64encode
    from akrelay.protocol.signer import Signer

    signer = Signer.generate(secrets.token_bytes)
    doc = {"agent_id": signer.agent_id, "seed": b64encode(signer.seed)}
    try:
        _write_private(Path(args.key), json.dumps(doc, indent=2) + "\n", args.force)
    except FileExistsError:
        return _fail(f"{args.key} exists; use --force to overwrite it")
    except OSError as exc:
        return _fail(f"cannot write {args.key}: {exc.strerror}")
    print(json.dumps({"agent_id": signer.agent_id, "key": str(args.key)}))
    return 0


def _read_json_file(name: str) -> JSON:
    from akrelay.protocol.ijson import parse_strict

    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        return parse_strict(data, code="invalid_request")
    except OSError as exc:
        raise SystemExit(_fail(f"cannot read {name}: {exc.strerror}"))
    except ProtocolError as exc:
        raise SystemExit(_fail(f"{name} is not strict JSON: {exc.message}"))


def _nonce_clock(key: str) -> tuple[NonceClock, Path]:
    """The key's nonce clock, resumed from ``KEY_FILE.nonce`` beside it."""
    from akrelay.protocol.signer import NonceClock

    state = Path(str(key) + ".nonce")
    try:
        return NonceClock(int(state.read_text(encoding="ascii").strip())), state
    except FileNotFoundError:
        return NonceClock(), state
    except (OSError, ValueError) as exc:
        raise SystemExit(_fail(f"cannot read nonce state {state}: {exc}"))


def _save_nonce(clock: NonceClock, state: Path) -> None:
    tmp = state.with_suffix(".nonce.tmp")
    tmp.write_text(str(clock.peek()), encoding="ascii")
    os.replace(tmp, state)


def _apply_target(args: argparse.Namespace, payload: JSONObject) -> None:
    """``--target`` fills the event ID an assessment or retraction points at."""
    from akrelay.protocol.payload import is_canonical_id

    if args.target is not None:
        if args.type == "publish":
            raise SystemExit(_fail("--target is for assess and retract; a publication links events in "
                                   "payload.relations"))
        if not is_canonical_id(args.target):
            raise SystemExit(_fail(f"--target {args.target!r} is not an event ID (the 43-character \"hash\" "
                                   "that `akrelay sign` printed)"))
        payload["target"] = args.target
    elif args.type != "publish" and not is_canonical_id(payload.get("target")):
        raise SystemExit(_fail(f"payload.target is not an event ID; pass --target EVENT_ID (the \"hash\" that "
                               f"`akrelay sign` printed for the event you {args.type})"))


def cmd_sign(args: argparse.Namespace) -> int:
    from akrelay.protocol import signer as signing
    from akrelay.protocol.envelope import verify_envelope

    signer = load_signer(args.key)
    payload = _read_json_file(args.payload)
    if not isinstance(payload, dict):
        return _fail("the payload must be a JSON object")
    _apply_target(args, payload)
    created_at = args.created_at if args.created_at is not None else time.time_ns() // 1_000_000
    if not 0 <= created_at <= 2**53 - 1:
        return _fail(f"--created-at {created_at} is not in 0..2^53-1 (Unix milliseconds)")
    build = {"publish": signing.publish_event, "assess": signing.assess_event, "retract": signing.retract_event}
    clock, state = _nonce_clock(args.key)
    nonce = clock.next(created_at)
    envelope = signer.sign(build[args.type](signer.agent_id, created_at, nonce, payload))
    text = json.dumps(envelope, ensure_ascii=False)
    try:
        verify_envelope(text.encode())  # never hand out an envelope a relay would refuse as malformed
    except ProtocolError as exc:
        return _fail(f"the signed envelope is invalid: {exc.code}: {exc.message}")
    _save_nonce(clock, state)  # only a nonce that was handed out is used up
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        print(json.dumps({"hash": envelope["hash"], "output": args.output}))
    else:
        print(text)
    return 0


# -- relay operations --------------------------------------------------------------------


def _client(args: argparse.Namespace) -> RelayClient:
    from akrelay.client import RelayClient

    return RelayClient(args.relay, cacert=args.cacert)


def _run(args: argparse.Namespace, action: Callable[[RelayClient], int]) -> int:
    import httpx

    from akrelay.client import ResponseError, ServiceError, connection_failure

    try:
        with _client(args) as client:
            return action(client)
    except ServiceError as exc:
        detail = f" {json.dumps(exc.data)}" if exc.data is not None else ""
        retry = f" (Retry-After: {exc.retry_after} s)" if exc.retry_after else ""
        print(printable(f"error: {exc.code} ({exc.status}): {exc.message}{detail}{retry}"), file=sys.stderr)
        return EXIT_REFUSED
    except ResponseError as exc:
        print(printable(f"error: invalid_response: {exc.message}"), file=sys.stderr)
        return EXIT_RESPONSE
    except httpx.HTTPError as exc:
        print(f"error: {connection_failure(exc, args.relay, args.cacert)}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _print(value: object) -> None:
    """One JSON value on one line, every non-printable character escaped (records come from a relay)."""
    from akrelay.cli.terminal import dumps

    print(dumps(value, separators=(",", ":")))


def cmd_submit(args: argparse.Namespace) -> int:
    """Every envelope is checked locally first, so that a bad one is reported before any is sent."""
    from akrelay.protocol.envelope import verify_envelope
    from akrelay.protocol.ijson import parse_strict

    raws = []
    for name in args.envelopes:
        try:
            raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
            parse_strict(raw, code="invalid_request")
        except OSError as exc:
            return _fail(f"cannot read {name}: {exc.strerror}")
        except ProtocolError as exc:
            return _fail(f"{name} is not strict JSON: {exc.message}")
        try:
            verify_envelope(raw.strip())
        except ProtocolError as exc:  # the code the relay would answer; nothing was sent
            return _fail(f"{name}: {exc.code}: {exc.message} (checked locally: no envelope was submitted)")
        raws.append(raw.strip())

    def action(client: RelayClient) -> int:
        for raw in raws:
            record = client.submit(raw)
            _print(record)
            if getattr(args, "prove", False) and _prove(client, record):
                return EXIT_REFUSED
        return 0

    return _run(args, action)


def _prove(client: RelayClient, record: AcceptanceRecord) -> int:
    """``--prove``: verify the record's inclusion proof (stderr says how it went); non-zero on a mismatch."""
    from akrelay.cli.audit import prove
    from akrelay.relay.audit import AuditFailure

    try:
        print(prove(client, record), file=sys.stderr)
    except AuditFailure as exc:
        print(f"error: inclusion proof: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    def action(client: RelayClient) -> int:
        record = client.get(args.event_id)
        _print(record)
        return EXIT_REFUSED if getattr(args, "prove", False) and _prove(client, record) else 0

    return _run(args, action)


def cmd_query(args: argparse.Namespace) -> int:
    pairs = []
    for item in args.params:
        name, sep, value = item.partition("=")
        if not sep or not name:
            return _fail(f"query parameters are NAME=VALUE, got {item!r}")
        pairs.append((name, value))

    def action(client: RelayClient) -> int:
        count = pages = 0
        checkpoint = as_of = None
        for page in client.query_pages(pairs):
            pages += 1
            checkpoint, as_of = page["checkpoint"], page["as_of"]
            for record in page["result"]:
                count += 1
                _print(record)
        _print({"checkpoint": checkpoint, "as_of": as_of, "service": client.origin, "count": count, "pages": pages})
        return 0

    return _run(args, action)


def cmd_batch(args: argparse.Namespace) -> int:
    def batch(client: RelayClient) -> int:
        _print(client.batch(args.event_ids))
        return 0

    return _run(args, batch)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE
