"""``akrelay ask "question"``: one KnowQL turn against a relay, streamed to the terminal.

The answer text is printed as it streams, then the citations with their
BELIEF status (what the relay's projection says of each cited capsule).
``--retrieval-only`` prints the retrieved capsules and passages instead of a
composed answer; ``--json`` prints the final Query document as one line.
"""

from __future__ import annotations

import argparse
import json
import sys

from akrelay.cli.client import relay_args
from akrelay.cli.search import EXIT_REFUSED, EXIT_RESPONSE, EXIT_USAGE
from akrelay.cli.terminal import dumps, elements, members, printable
from akrelay.jsontypes import JSON, JSONObject

DEFAULT_SCOPE = "knowledge"
EXIT_FAILED = 4


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "ask", help="ask the relay's knowledge a question (KnowQL POST /query); prints a cited answer",
        description="Run one KnowQL turn. The answer streams as it is composed, followed by its citations and "
                    "the belief status of each cited capsule. Continue a conversation with --session.")
    p.add_argument("question", metavar="QUESTION", help="the natural-language question")
    p.add_argument("--session", metavar="ID", help="continue this session (ses_…) instead of starting one")
    p.add_argument("--scope", action="append", metavar="CONTEXT",
                   help=f"context slug or id for a new session; repeatable (default {DEFAULT_SCOPE})")
    p.add_argument("--retrieval-only", action="store_true",
                   help="skip composition: print the retrieved capsules and passages")
    p.add_argument("--shape", metavar="FILE", help="a JSON Schema file; the answer's output_json must conform")
    p.add_argument("--json", action="store_true", help="print the final Query document as JSON")
    relay_args(p)
    p.set_defaults(handler=cmd_ask)


def build_document(args: argparse.Namespace) -> JSONObject:
    doc: JSONObject = {"ask": args.question}
    if args.session:
        doc["session_id"] = args.session
    else:
        doc["scope"] = args.scope or [DEFAULT_SCOPE]
    if args.retrieval_only:
        doc["retrieval_only"] = True
    if args.shape:
        with open(args.shape, encoding="utf-8") as fh:
            doc["shape"] = json.load(fh)
    return doc


def format_citations(doc: JSONObject) -> list[str]:
    lines = []
    for n, citation in enumerate(map(members, elements(doc.get("citations"))), start=1):
        belief = citation.get("belief", "unknown")
        title = citation.get("title") or ""
        lines.append(printable(f"[{n}] {belief:<12} {citation.get('source')}  {title}", keep=""))
    return lines


def format_retrieval(envelope: JSONObject) -> list[str]:
    counts = members(envelope["counts"])
    lines = [f"{counts['artifacts']} capsule(s), {counts['chunks']} passage(s)"]
    for artifact in map(members, elements(envelope.get("artifacts"))):
        belief = members(artifact.get("belief")).get("status", "unknown")
        lines.append(printable(f"  {artifact.get('rank', '?'):>3}. {belief:<12} {artifact['source']}  "
                               f"{artifact.get('name', '')}", keep=""))
    for chunk in map(members, elements(envelope.get("chunks"))):
        text = " ".join(str(chunk.get("text", "")).split())
        text = text if len(text) <= 100 else text[:99] + "…"
        lines.append(printable(f"  - {chunk['kind']:<10} {chunk['source']}  {text}", keep=""))
    return lines


def cmd_ask(args: argparse.Namespace) -> int:
    import httpx

    from akrelay.client import RelayClient, ResponseError, ServiceError

    try:
        document = build_document(args)
    except (OSError, ValueError) as exc:
        print(f"error: --shape: {exc}", file=sys.stderr)
        return EXIT_USAGE
    streamed = not args.json and not args.retrieval_only

    def show(event: JSON) -> None:
        if isinstance(event, dict) and event.get("type") == "response.output_text.delta":
            sys.stdout.write(printable(str(event.get("delta", ""))))
            sys.stdout.flush()

    try:
        with RelayClient(args.relay, cacert=args.cacert) as client:
            doc = client.ask(document, on_event=show if streamed else None)
    except (ServiceError, ResponseError, httpx.HTTPError, ValueError, OSError) as exc:
        return _refused(exc, args)
    if args.json:
        print(dumps(doc, separators=(",", ":")))
        return 0 if doc.get("status") == "completed" else EXIT_FAILED
    if doc.get("status") != "completed":
        if streamed:
            print()
        print(printable(f"error: the turn {doc.get('status')}: {doc.get('error')}", keep=""), file=sys.stderr)
        return EXIT_FAILED
    if args.retrieval_only:
        print("\n".join(format_retrieval(members(doc.get("output_json")) or {"counts": {"artifacts": 0, "chunks": 0}})))
    else:
        print()
        if doc.get("output_json") is not None:
            print(dumps(doc["output_json"], indent=2))
        citations = format_citations(doc)
        if citations:
            print("\nCitations:")
            print("\n".join(citations))
    extension = members(doc.get("akrelay"))
    print("\n" + printable(f"session {doc.get('session_id')}  query {doc.get('id')}  "
                           f"snapshot seq {extension.get('snapshot_seq')}", keep=""))
    return 0


def _refused(exc: Exception, args: argparse.Namespace) -> int:
    """The message and exit code of a turn the relay (or the connection) refused."""
    import httpx

    from akrelay.client import ResponseError, ServiceError, connection_failure

    if isinstance(exc, ServiceError):
        message, code = f"{exc.code} ({exc.status}): {exc.message}", EXIT_REFUSED
    elif isinstance(exc, ResponseError):
        message, code = f"invalid_response: {exc}", EXIT_RESPONSE
    elif isinstance(exc, httpx.HTTPError):
        message, code = connection_failure(exc, args.relay, args.cacert), EXIT_USAGE
    else:
        message, code = str(exc), EXIT_USAGE
    print(printable(f"error: {message}"), file=sys.stderr)
    return code
