"""``akrelay kql 'FIND … WHERE { … }' --param name=value``: run one KQL query.

Against a local data directory (``--data``, the default ``./akrelay-data``) the
query runs in process on the nexus resumed from its snapshot and caught up from
the store; with ``--relay URL`` it is sent to that relay's ``POST /v1/kip``.
Output is a table (``FIND`` columns, one line per row) or, with ``--json``, the
operation result with its context. A syntax or semantic error prints the KIP
error (code, position, hint) and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys

from akrelay.cli.kip import DEFAULT_DATA, add_target_args, open_node, parse_params, post_kip
from akrelay.cli.terminal import dumps, elements, members, printable
from akrelay.jsontypes import JSONMapping, JSONObject



def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("kql", help="run a KIP KQL query against the relay's nexus",
                              description="Run one read-only KQL query and print its rows.")
    p.add_argument("query", metavar="QUERY", help="e.g. 'FIND(?c.name) WHERE { ?c {type: \"KnowledgeCapsule\"} }'")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="bind :NAME structurally (VALUE is JSON; bare text is taken as a string)")
    add_target_args(p)
    p.add_argument("--json", action="store_true", help="print the result and context as JSON")
    p.set_defaults(handler=run_kql)


def _cell(value: object) -> str:
    """A compact table cell, one line, shown as stored (no control character reaches the terminal)."""
    return printable(_cell_text(value), keep="")


def _cell_text(value: object) -> str:
    """Elements by kind and id, beliefs by status, JSON otherwise."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        if "kind" in value and "id" in value:
            label = value.get("name") or value.get("key") or ""
            return f"{value['kind']}:{value['id']}" + (f" ({label})" if label else "")
        if "status" in value and "basis" in value:
            return f"belief:{value['status']}"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def format_table(result: JSONObject) -> str:
    columns = [col if isinstance(col, str) else _cell_text(col) for col in elements(result.get("columns"))]
    body = [[_cell(c) for c in elements(row)] for row in elements(result.get("rows"))]
    widths = [max([len(col)] + [len(r[i]) for r in body]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in body]
    footer = f"({len(body)} row{'s' if len(body) != 1 else ''}"
    if result.get("next_cursor"):
        footer += f"; more available, next cursor: {result['next_cursor']}"
    lines.append(printable(footer + ")", keep=""))
    return "\n".join(lines)


def _print_error(error: JSONObject) -> None:
    where = ""
    details = members(error.get("details"))
    if "line" in details:
        where = f" (line {details['line']}, column {details.get('column')})"
    print(printable(f"akrelay kql: {error['code']}{where}: {error['message']}", keep=""), file=sys.stderr)
    if error.get("hint"):
        print(printable(f"  hint: {error['hint']}", keep=""), file=sys.stderr)


def _emit(entry: JSONObject, as_json: bool) -> int:
    if entry.get("status") != "succeeded":
        if as_json:
            print(dumps({"error": entry["error"], "context": entry.get("context")}, indent=2))
        _print_error(members(entry["error"]))
        return 1
    result = dict(members(entry["result"]))
    if "next_cursor" in entry:
        result["next_cursor"] = entry["next_cursor"]
    if as_json:
        print(dumps({"result": result, "context": entry.get("context")}, indent=2))
    else:
        print(format_table(result))
    return 0


def run_kql(args: argparse.Namespace) -> int:
    params = parse_params(args.param, "akrelay kql")
    envelope: JSONMapping
    request: JSONObject = {"kip": "2.0", "operations": [{"language": "KQL", "command": args.query, "parameters": params}]}
    if args.relay:
        status, body = post_kip(args, request)
        if not isinstance(body, dict):
            if status:
                print(f"akrelay kql: {args.relay} answered HTTP {status} without a KIP response envelope",
                      file=sys.stderr)
            return 1
        envelope = body
    else:
        node = open_node(args.data or DEFAULT_DATA, args, "akrelay kql")
        try:
            _, envelope = node.kip.gateway.read_once().execute(request)
        finally:
            node.stop()
    results, error = envelope.get("results"), envelope.get("error")
    if isinstance(results, list) and results and isinstance(results[0], dict):
        return _emit(results[0], args.json)
    _print_error(error if isinstance(error, dict) and error else {"code": "InternalError", "message": "no result"})
    return 1
