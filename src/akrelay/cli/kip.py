"""``akrelay kip`` (run KIP commands) and ``akrelay reindex --kip`` (alias ``akrelay kip-reindex``).

``reindex`` itself is the search area's command; this module adds ``--kip`` to it.

``akrelay kip 'DESCRIBE PRIMER' --data DIR`` reads the nexus of a local relay data
directory (its ``kip-nexus.sqlite3``, caught up from the store); ``--relay URL``
sends the command to a running relay's ``POST /v1/kip`` instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from akrelay.cli.store import add_store_arguments, missing_log, store_values
from akrelay.cli.terminal import dumps
from akrelay.kip.budget import DEFAULT_BUDGET_MS
from akrelay.jsontypes import JSON, JSONMapping, JSONObject

if TYPE_CHECKING:
    from akrelay.node import RelayNode

DEFAULT_DATA = "./akrelay-data"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("kip", help="run a KIP META/KQL command against the relay's nexus",
                              description="Run one KIP command (read-only) and print the response envelope.")
    p.add_argument("command_text", metavar="COMMAND", help="e.g. 'DESCRIBE PRIMER' or 'SEARCH CONCEPT \"cache\"'")
    p.add_argument("--param", action="append", default=[], metavar="NAME=JSON",
                   help="bind a parameter (value is JSON; bare text is taken as a string)")
    add_target_args(p)
    p.add_argument("--belief", action="store_true",
                   help="treat COMMAND as a capsule ID and print its ak_holds projection")
    p.add_argument("--policy", help="with --belief: the epistemic policy")
    p.add_argument("--as-of", type=int, help="with --belief: the space_seq to read at")
    p.set_defaults(handler=run_kip)

    r = subparsers.add_parser("kip-reindex", help="alias of `akrelay reindex --kip`: rebuild the KIP nexus",
                              description="Alias of `akrelay reindex --kip`: rebuild the KIP nexus "
                                          "(DIR/kip-nexus.sqlite3) from the acceptance log in DIR. "
                                          "Run it with the relay stopped.")
    r.add_argument("--data", default=DEFAULT_DATA, metavar="DIR",
                   help=f"the relay's data directory (default {DEFAULT_DATA})")
    r.add_argument("--origin", help="the relay origin the Space id is derived from "
                                    "(default: the one `serve` recorded in --data)")
    add_store_arguments(r)
    r.set_defaults(handler=run_reindex)

    # `akrelay reindex --kip`: plain `reindex` (the Tantivy index) belongs to the search
    # area (akrelay.cli.search, registered earlier); extend its parser with --kip rather
    # than register a second command. Without it, register a `reindex` that needs --kip.
    existing = getattr(subparsers, "choices", {}).get("reindex")
    if existing is not None:
        existing.add_argument("--kip", action="store_true",
                              help="rebuild the KIP nexus (kip-nexus.sqlite3) instead of the search index")
        try:
            existing.add_argument("--origin", help="with --kip: the relay origin "
                                                   "(default: the one `serve` recorded in --data)")
        except argparse.ArgumentError:  # registered already (the parser is built more than once)
            pass
        search_handler = existing.get_default("handler")

        def reindex_either(args: argparse.Namespace) -> int:
            if args.kip:
                return run_reindex(args)
            status: int = search_handler(args)
            return status

        existing.set_defaults(handler=reindex_either)
    else:
        rr = subparsers.add_parser("reindex", help="rebuild derived indexes from the acceptance log")
        rr.add_argument("--kip", action="store_true", required=True, help="rebuild the KIP nexus")
        rr.add_argument("--data", default=DEFAULT_DATA, metavar="DIR")
        rr.add_argument("--origin", help="the relay origin (default: the one `serve` recorded in --data)")
        add_store_arguments(rr)
        rr.set_defaults(handler=run_reindex)


def open_node(data: str, args: argparse.Namespace, command: str = "akrelay") -> RelayNode:
    """The data directory's relay with only its KIP component, or a clear exit if there is no store.

    The KIP Space id embeds the relay's origin, so the origin is ``--origin`` or the one
    ``serve`` recorded in the data directory; a guess would stamp or read the wrong Space.
    """

    from akrelay.node import RelayNode
    from akrelay.settings import SettingsError, load_settings, with_data_origin

    budget = getattr(args, "budget_ms", None)
    settings = load_settings({"data": data, "origin": getattr(args, "origin", None) or None,
                              "kip_budget_ms": budget if budget is not None else None, **store_values(args)})
    missing = missing_log(settings)
    if missing is not None:
        raise SystemExit(f"{command}: {missing}")
    try:
        settings = with_data_origin(settings)
    except SettingsError as exc:
        raise SystemExit(f"{command}: {exc}") from None
    return RelayNode.open(settings, components=("kip",))


def run_reindex(args: argparse.Namespace) -> int:
    node = open_node(args.data, args)
    try:
        summary = node.kip.reindex()
    except RuntimeError as exc:
        print(f"akrelay reindex --kip: {exc}", file=sys.stderr)
        return 1
    finally:
        node.stop()
    print(json.dumps(summary, indent=2))
    return 0


def parse_params(items: list[str], command: str = "akrelay kip") -> JSONObject:
    """``NAME=VALUE`` bindings: VALUE is strict I-JSON, or else taken as a bare string.

    A value that starts like a JSON array, object or string but is not I-JSON
    (a duplicate member, too deep) is an error rather than silently a string.
    """
    from akrelay.protocol.errors import ProtocolError
    from akrelay.protocol.ijson import parse_strict

    out: JSONObject = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.lstrip(":")
        if not sep or not name:
            raise SystemExit(f"{command}: --param wants NAME=VALUE, got {item!r}")
        try:
            out[name] = parse_strict(value, code="invalid_request")
        except ProtocolError as exc:
            if value.lstrip()[:1] in ("[", "{", '"'):
                raise SystemExit(f"{command}: --param {name}: {exc.message}") from None
            out[name] = value
    return out


def add_target_args(p: argparse.ArgumentParser) -> None:
    """Where ``akrelay kip`` and ``akrelay kql`` read: a local data directory or a running
    relay, with ``--cacert`` (trust its self-signed certificate) as the other client commands."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--data", metavar="DIR", help=f"local relay data directory (default {DEFAULT_DATA})")
    where.add_argument("--relay", metavar="URL", help="a running relay's origin, e.g. https://relay.example")
    p.add_argument("--origin", help="with --data: the relay origin the Space id is derived from")
    p.add_argument("--cacert", default=os.environ.get("AKRELAY_CACERT"), metavar="PEM",
                   help="with --relay: PEM certificate to trust, e.g. the relay's tls-cert.pem [env AKRELAY_CACERT]")
    p.add_argument("--insecure", action="store_true", help="with --relay: do not verify TLS (testing only)")
    p.add_argument("--budget-ms", type=_budget_ms, default=DEFAULT_BUDGET_MS, metavar="MS",
                   help=f"with --data: thread CPU milliseconds the command may use before it fails ExecutionTimeout "
                        f"(default {DEFAULT_BUDGET_MS}; 0: no budget). A relay applies its own --kip-budget-ms")
    add_store_arguments(p)


def _budget_ms(text: str) -> int:
    from akrelay.kip.options import budget_ms

    try:
        return budget_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def post_kip(args: argparse.Namespace, request: JSONMapping, *, timeout: float = 60.0) -> tuple[int, JSON]:
    """POST a KIP request envelope to ``--relay``; ``(HTTP status, decoded body or None)``."""
    import httpx

    from akrelay.cli.terminal import printable
    from akrelay.client import RelayClient, ResponseError, connection_failure

    try:  # the bounded client: one deadline, identity coding only, the body capped as it arrives
        with RelayClient(args.relay, cacert=args.cacert, insecure=args.insecure, timeout=timeout,
                         discover=False) as client:
            return client.post_json("/v1/kip", request)
    except httpx.HTTPError as exc:
        print(f"akrelay {args.command}: {connection_failure(exc, args.relay, args.cacert)}", file=sys.stderr)
        return 0, None
    except ResponseError as exc:
        print(printable(f"akrelay {args.command}: invalid_response: {exc.message}"), file=sys.stderr)
        return 0, None
    except (ValueError, OSError) as exc:
        print(f"akrelay {args.command}: {exc}", file=sys.stderr)
        return 0, None


def run_kip(args: argparse.Namespace) -> int:
    request: JSONObject = {"kip": "2.0", "operations": [{"command": args.command_text, "parameters": parse_params(args.param)}]}
    if args.relay:
        status, body = post_kip(args, request, timeout=30)
        if not isinstance(body, dict):
            if status:
                print(f"akrelay kip: {args.relay} answered HTTP {status} without a KIP response envelope",
                      file=sys.stderr)
            return 1
        print(dumps(body, indent=2))
        return 0 if status == 200 and body.get("status") == "succeeded" else 1
    from akrelay.kip.errors import KipError

    node = open_node(args.data or DEFAULT_DATA, args)
    try:
        runtime = node.kip.gateway.read_once()
        if args.belief:
            try:
                out: object = runtime.project_capsule(args.command_text, policy=args.policy, as_of=args.as_of)
                status = 0
            except KipError as exc:
                out, status = {"error": exc.to_wire()}, 1
        else:
            _, out = runtime.execute(request)
            status = 0 if out["status"] == "succeeded" else 1
    finally:
        node.stop()
    print(dumps(out, indent=2))
    return status
