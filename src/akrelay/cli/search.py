"""``akrelay search`` (ranked search client) and ``akrelay reindex`` (rebuild the index).

``search`` reads the relay's discovery first: a relay that does not advertise
``ranked-search`` and the requested mode is refused locally, never silently
replaced by another mode. Every returned envelope is verified and the page is
checked against the §9.5 contract before anything is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from akrelay.cli.client import relay_args
from akrelay.cli.store import add_store_arguments, missing_log, store_values
from akrelay.cli.terminal import dumps, members, printable
from akrelay.jsontypes import JSONObject
from akrelay.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from akrelay.client import SearchPage

# Exit codes, as for the other client commands: 1 refused, 2 usage/local error, 3 bad response.
EXIT_REFUSED, EXIT_USAGE, EXIT_RESPONSE = 1, 2, 3
_INTEGER_FILTERS = ("created_from", "created_before")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "search", help="ranked search on a relay (Knowledge §9.5); prints hits and coverage",
        description="Run one ranked search and print the hits in relevance order with the coverage the relay "
                    "reports. Lexical hits match TEXT exactly as `query q=TEXT` would; coverage says whether the "
                    "page holds every match.")
    p.add_argument("text", metavar="TEXT", help="search text (lexical: 1-16 terms separated by whitespace)")
    p.add_argument("--mode", default="lexical", help="search mode; must be advertised by the relay (default lexical)")
    p.add_argument("--filter", dest="filters", action="append", default=[], metavar="NAME=VALUE",
                   help="exact filter (actor, type, kind, target, relation, tag, profile, language, verdict, "
                        "created_from, created_before); repeatable, combined with AND")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="hits to return, 1-100 (default 20)")
    p.add_argument("--json", action="store_true", help="print the verified response JSON instead of a listing")
    relay_args(p)
    p.set_defaults(handler=cmd_search)

    p = subparsers.add_parser(
        "reindex", help="rebuild the search index of a data directory from its store",
        description="Drop and rebuild the Tantivy search index from the acceptance log. Run it with the relay "
                    "stopped (a running relay owns the index writer); a running relay also rebuilds a missing "
                    "or corrupt index by itself at start.")
    p.add_argument("--data", default=os.environ.get("AKRELAY_DATA", "./akrelay-data"), metavar="DIR",
                   help="data directory [env AKRELAY_DATA; default ./akrelay-data]")
    add_store_arguments(p)
    p.set_defaults(handler=cmd_reindex)


def build_request(text: str, mode: str, filters: list[str], limit: int | None) -> JSONObject:
    """The JSON request body from command-line values (validation is the relay's job)."""
    body: JSONObject = {"text": text, "mode": mode}
    parsed: JSONObject = {}
    for item in filters:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--filter expects NAME=VALUE, got {item!r}")
        if name in parsed:
            raise ValueError(f"--filter {name} given twice")
        if name in _INTEGER_FILTERS:
            if not value.isdigit():
                raise ValueError(f"--filter {name} must be an integer (Unix milliseconds)")
            parsed[name] = int(value)
        else:
            parsed[name] = value
    if parsed:
        body["filters"] = parsed
    if limit is not None:
        body["limit"] = limit
    return body


def format_page(page: SearchPage) -> str:
    """A listing: one header with ranking and coverage, then one line per hit."""
    coverage = page["coverage"]
    state = "exhaustive" if coverage["exhaustive"] else "NOT exhaustive (" + ", ".join(coverage["reasons"]) + ")"
    index_seq = f", index_seq {page['index_seq']}" if "index_seq" in page else ""
    lines = [
        f"{len(page['result'])} hit(s) from {page['service']} at checkpoint {page['checkpoint']}{index_seq}",
        f"ranking: {page['ranking']['mode']} {page['ranking']['id']}",
        f"coverage: {state}",
    ]
    for rank, hit in enumerate(page["result"], 1):
        record = hit["record"]
        event = record["envelope"]["event"]
        payload = members(event["payload"])
        label = payload.get("title") or payload.get("summary") or payload.get("reason") or ""
        if isinstance(label, str) and len(label) > 80:
            label = label[:79] + "…"
        lines.append(f"{rank:>3}. {record['envelope']['hash']}  seq {record['seq']}  {event['type']}  {label!r}")
        if "explanation" in hit:
            lines.append(f"     {hit['explanation']}")
    return "\n".join(printable(line, keep="") for line in lines)  # each line one line, shown as sent


def cmd_search(args: argparse.Namespace) -> int:
    import httpx

    from akrelay.client import RelayClient, ResponseError, ServiceError, connection_failure
    from akrelay.protocol.reads import parse_search_request
    from akrelay.protocol.records import validate_search_response

    try:
        body = build_request(args.text, args.mode, args.filters, args.limit)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with RelayClient(args.relay, cacert=args.cacert) as client:
            doc = client.ensure_discovery() or {}
            modes = doc.get("search_modes", []) if "ranked-search" in doc.get("features", []) else []
            if args.mode not in modes:
                print(f"error: unsupported_search_mode: {client.origin} does not advertise ranked search "
                      f"in mode {args.mode!r} (advertised: {', '.join(modes) or 'none'})", file=sys.stderr)
                return EXIT_REFUSED
            page = client.search_page(body)
            try:
                request = parse_search_request(body, modes)
            except ProtocolError:
                request = None  # the relay accepted what we could not parse: still check the shape below
            if request is not None:
                try:
                    validate_search_response(page, request, client.origin)
                except ProtocolError as exc:
                    raise ResponseError(exc.message) from None
    except ServiceError as exc:
        detail = f" {json.dumps(exc.data)}" if exc.data is not None else ""
        print(printable(f"error: {exc.code} ({exc.status}): {exc.message}{detail}"), file=sys.stderr)
        return EXIT_REFUSED
    except ResponseError as exc:
        print(printable(f"error: invalid_response: {exc}"), file=sys.stderr)
        return EXIT_RESPONSE
    except httpx.HTTPError as exc:
        print(f"error: {connection_failure(exc, args.relay, args.cacert)}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(dumps(page, separators=(",", ":")))
    else:
        print(format_page(page))
    return 0


def cmd_reindex(args: argparse.Namespace) -> int:
    from pathlib import Path

    from akrelay.node import RelayNode
    from akrelay.settings import load_settings

    data = Path(args.data)
    settings = load_settings({"data": str(data), **store_values(args)})
    missing = missing_log(settings)
    if missing is not None:
        print(f"error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    node = RelayNode.open(settings, components=("search",))
    try:
        count = node.search.reindex()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        node.stop()
    print(f"reindexed {count} record(s) into {data / 'search'}")
    return 0
