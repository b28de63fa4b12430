"""``akrelay audit URL``: verify a relay's signed Merkle log from the outside (docs/transparency.md).

Exit status: 0 when everything checked out, 1 on a mismatch (the message says
what and where), 2 when the relay cannot be asked (usage, network, no log).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akrelay.client import AcceptanceRecord, RelayClient

EXIT_MISMATCH, EXIT_USAGE = 1, 2


def default_state() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "akrelay" / "audit.json"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "audit", help="verify a relay's signed Merkle log: signature, consistency, and (--full) every record",
        description="Fetch the relay's checkpoint, verify its signature (discovery's key or --key), check it is "
                    "consistent with the last checkpoint seen from that origin (kept in --state), and with --full "
                    "recompute the root from /v1/knowledge/log and verify every record that is not withheld.")
    p.add_argument("url", metavar="URL", help="the relay's origin, e.g. https://localhost:8443")
    p.add_argument("--key", default=None, metavar="VKEY", help="pin the log's verifier key (C2SP vkey) instead of "
                   "trusting the discovery document")
    p.add_argument("--full", action="store_true", help="recompute the root from every entry and check every record")
    p.add_argument("--state", default=None, metavar="FILE",
                   help=f"where the last verified checkpoint per origin is kept (default {default_state()})")
    p.add_argument("--cacert", default=os.environ.get("AKRELAY_CACERT"), metavar="PEM",
                   help="CA certificate to trust (a relay's self-signed tls-cert.pem)")
    p.add_argument("--witness", action="append", default=[], metavar="VKEY",
                   help="a witness's cosignature/v1 verifier key (its discovery `log.witness.vkey`); repeatable")
    p.add_argument("--quorum", type=int, default=None, metavar="K",
                   help="how many distinct --witness keys must have cosigned a checkpoint consistent with the "
                        "audited one (default: all of them)")
    p.set_defaults(handler=cmd_audit)

    w = subparsers.add_parser(
        "witness", help="ask a witness relay to cosign a log's latest checkpoint (C2SP tlog-witness)",
        description="Fetch the log's latest signed checkpoint and push it to the witness's add-checkpoint "
                    "(with the log's consistency proof from the size the witness last cosigned); print the "
                    "cosigned checkpoint.")
    w.add_argument("url", metavar="LOG_URL", help="the log relay's origin")
    w.add_argument("witness_url", metavar="WITNESS_URL", help="the witness relay's origin")
    w.add_argument("--key", default=None, metavar="VKEY", help="pin the log's verifier key")
    w.add_argument("--cacert", default=os.environ.get("AKRELAY_CACERT"), metavar="PEM",
                   help="CA certificate(s) to trust for both relays (a bundle is fine)")
    w.set_defaults(handler=cmd_witness)


class _Progress:
    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.5:
            return
        self.last = now
        width = 30
        filled = width * done // max(total, 1)
        line = f"audit: {what:8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        print(("\r" + line) if self.tty else line, end="" if self.tty and done < total else "\n", file=sys.stderr)


def cmd_audit(args: argparse.Namespace) -> int:
    import httpx

    from akrelay.cli.terminal import printable
    from akrelay.client import RelayClient, ResponseError, ServiceError, connection_failure
    from akrelay.relay.audit import AuditFailure, State, audit, verifier_for

    def say(text: str, *, err: bool = True) -> None:
        # what a relay sent (its error messages, its checkpoint's origin) reaches the terminal escaped
        print(printable(text), file=sys.stderr if err else sys.stdout)

    from akrelay.relay.quorum import check_quorum, describe, fetch_with, parse_witnesses

    state_path = Path(args.state) if args.state else default_state()
    quorum_lines: list[str] = []
    try:
        witnesses = parse_witnesses(args.witness)
        quorum = len(witnesses) if args.quorum is None else args.quorum
        if quorum < 0 or quorum > len(witnesses) or (args.quorum is not None and not witnesses):
            raise ValueError(f"--quorum {quorum} needs at least that many distinct --witness keys "
                             f"({len(witnesses)} given)")
        state = State(state_path)
        with RelayClient(args.url, cacert=args.cacert) as client:
            result = audit(client, pinned=args.key, state=None if witnesses else state, full=args.full,
                           progress=_Progress())
            if witnesses:  # the state file moves only once the quorum is met too
                from akrelay.relay.audit import LogReader

                previous = state.get(result.checkpoint.origin)
                if previous is not None:
                    from akrelay.relay.audit import check_consistency

                    result.previous = previous.size
                    check_consistency(LogReader(client), previous, result.checkpoint)
                verifier, _ = verifier_for(client, args.key)
                outcome = check_quorum(result.checkpoint, result.note, verifier, witnesses, fetch_with(client),
                                       LogReader(client).consistency)
                quorum_lines = describe(outcome, quorum)
                for line in quorum_lines:
                    say(f"audit: {line}")
                if outcome.forked:
                    raise AuditFailure(f"{len(outcome.forked)} witness(es) cosigned a checkpoint inconsistent with "
                                       f"this one: the log showed them another history",
                                       ", ".join(sorted(outcome.forked)))
                if len(outcome.good) < quorum:
                    raise AuditFailure(f"witness quorum not met: {len(outcome.good)} of {quorum} required "
                                       f"cosigned a consistent checkpoint",
                                       "missing: " + ", ".join(sorted(outcome.missing)))
                state.put(result.checkpoint, result.note)
    except AuditFailure as exc:
        say(f"audit: MISMATCH: {exc}")
        return EXIT_MISMATCH
    except ServiceError as exc:
        say(f"audit: the relay refused a log read: {exc.code} ({exc.status}): {exc.message}")
        return EXIT_MISMATCH if exc.status == 400 else EXIT_USAGE
    except ResponseError as exc:
        say(f"audit: invalid response: {exc.message}")
        return EXIT_MISMATCH
    except httpx.HTTPError as exc:
        say(f"audit: {connection_failure(exc, args.url, args.cacert)}")
        return EXIT_USAGE
    except ValueError as exc:
        say(f"audit: {exc}")
        return EXIT_USAGE
    cp = result.checkpoint
    since = f", consistent with size {result.previous} seen before" if result.previous is not None else ", first seen"
    say(f"audit: ok: {cp.origin} size {cp.size} root {cp.root.hex()}{since}", err=False)
    if witnesses:
        say(f"audit: ok: {len(outcome.good)} of {len(witnesses)} witnesses cosigned a consistent checkpoint "
            f"(quorum {quorum})", err=False)
    if args.full:
        say(f"audit: ok: {result.entries} entries hash to the root; {result.records} records verified, "
            f"{result.withheld} withheld", err=False)
    return 0


def cmd_witness(args: argparse.Namespace) -> int:
    import httpx

    from akrelay.cli.terminal import printable
    from akrelay.client import RelayClient, ResponseError, ServiceError, connection_failure
    from akrelay.relay.audit import AuditFailure
    from akrelay.relay.witnessing import push_checkpoint

    try:
        with RelayClient(args.url, cacert=args.cacert) as log, \
                RelayClient(args.witness_url, cacert=args.cacert, discover=False) as witness:
            note = push_checkpoint(log, witness, pinned=args.key)
    except AuditFailure as exc:
        print(printable(f"witness: {exc}"), file=sys.stderr)
        return EXIT_MISMATCH
    except (ServiceError, ResponseError) as exc:
        print(printable(f"witness: the log refused a read: {exc}"), file=sys.stderr)
        return EXIT_MISMATCH
    except httpx.HTTPError as exc:
        print(printable(f"witness: {connection_failure(exc, args.url, args.cacert)}"), file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(printable(f"witness: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    print(printable(note), end="")
    return 0


def prove(client: RelayClient, record: AcceptanceRecord, *, wait: float = 15.0) -> str:
    """``get/submit --prove``: wait (up to ``wait`` s) for a checkpoint covering ``record``, verify its inclusion.

    Returns a one-line summary; raises :class:`akrelay.relay.audit.AuditFailure` on a mismatch.
    """
    from akrelay.relay.audit import AuditFailure, LogReader, fetch_checkpoint, verifier_for, verify_inclusion

    reader = LogReader(client)
    verifier, url = verifier_for(client, None)
    deadline = time.monotonic() + wait
    while True:
        checkpoint, _ = fetch_checkpoint(reader, verifier, url)
        try:
            index = verify_inclusion(reader, record, checkpoint)
            return f"proved: seq {record['seq']} is leaf {index} of {checkpoint.origin}'s tree of size {checkpoint.size}"
        except Exception as exc:  # noqa: BLE001 - not covered yet (400) or a real mismatch: retried until the deadline
            from akrelay.client import ServiceError

            if not isinstance(exc, ServiceError) or time.monotonic() > deadline:
                if isinstance(exc, ServiceError):
                    raise AuditFailure(f"no checkpoint covers seq {record['seq']} after {wait:.0f} s: {exc.message}") from None
                raise
        time.sleep(0.5)  # the relay signs at most once a second
