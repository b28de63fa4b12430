"""``akrelay peers`` (edit the peer file, show sync status) and ``akrelay sync``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from akrelay.backend import Backend
    from akrelay.node import RelayNode
    from akrelay.settings import Settings



def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    peers = subparsers.add_parser(
        "peers", help="edit the peer configuration file and show per-peer sync status",
        description="Edit a peer file (TOML, see peers/README.md) or show the sync state kept in a data directory.")
    peers.add_argument("--file", metavar="FILE", help="the peer configuration file (TOML)")
    peers.add_argument("--json", action="store_true", help="machine-readable output")
    sub = peers.add_subparsers(dest="peers_command", metavar="ACTION")

    lst = sub.add_parser("list", help="list configured peers")
    lst.set_defaults(handler=cmd_list)

    add = sub.add_parser("add", help="add a peer (or update an existing one)")
    add.add_argument("origin", metavar="ORIGIN", help="the peer's HTTPS origin, e.g. https://relay.example.org")
    add.add_argument("--ca-file", metavar="PEM", help="trust only this CA bundle for the peer")
    add.add_argument("--allow-private", action="store_true", default=None,
                     help="allow private and loopback addresses for this peer")
    add.add_argument("--interval", type=float, metavar="SECONDS", help="seconds between passes")
    add.add_argument("--page-limit", type=int, metavar="N", help="records per query page (1-1000)")
    add.add_argument("--max-page-bytes", type=int, metavar="N", help="largest accepted response body")
    add.add_argument("--disabled", action="store_true", help="add the peer disabled")
    add.add_argument("--no-push", dest="push", action="store_false", default=None,
                     help="never subscribe to the peer's push stream: poll it only")
    add.add_argument("--no-offer", dest="offer", action="store_false", default=None,
                     help="never offer the peer the events it lacks after a reconciliation")
    add.set_defaults(handler=cmd_add)

    rm = sub.add_parser("remove", help="remove a peer")
    rm.add_argument("origin", metavar="ORIGIN")
    rm.set_defaults(handler=cmd_remove)

    st = sub.add_parser("status", help="per-peer checkpoint, lag, last success, last error and counts")
    _state_arguments(st)
    st.set_defaults(handler=cmd_status)

    clear = sub.add_parser(
        "clear", help="clear a peer's misbehaving mark (the evidence is archived) so it is synced again",
        description="Archive the peer's misbehaviour evidence in its state (`peers status --json`, key "
                    "\"cleared\"), clear the mark, and forget what was verified: the next pass re-verifies "
                    "the peer's signed log from size 0 and re-enumerates its records from the start. "
                    "Safe while the relay runs.")
    clear.add_argument("origin", metavar="ORIGIN", help="the peer's origin, as `peers status` shows it")
    _state_arguments(clear)
    clear.set_defaults(handler=cmd_clear)
    def usage(args: argparse.Namespace) -> int:
        peers.print_help()
        return 0

    peers.set_defaults(handler=usage)

    from akrelay.settings import add_arguments

    sync = subparsers.add_parser(
        "sync", help="replicate from the configured peers (one pass with --once)",
        description="Replicate from every enabled peer of --peers into the relay in --data, through the "
                    "same acceptance pipeline as POST /events. Takes serve's storage, acceptance and federation "
                    "options (environment and --config as for serve); listener, TLS and rate options are "
                    "serve's alone.")
    sync.add_argument("--once", action="store_true", help="run one pass over every peer and exit")
    sync.add_argument("--reconcile", action="store_true",
                      help="reconcile the sets with every peer that supports it (or --peer), fetch what we lack, "
                           "print progress and a summary, and exit")
    sync.add_argument("--peer", metavar="ORIGIN", default=None, help="with --reconcile: only this configured peer")
    sync.add_argument("--since", metavar="MS", default=None,
                      help="with --reconcile: only events with created_at >= MS (Unix ms)")
    sync.add_argument("--until", metavar="MS", default=None,
                      help="with --reconcile: only events with created_at < MS (Unix ms)")
    sync.add_argument("--type", dest="types", metavar="TYPES", default=None,
                      help="with --reconcile: only these event types, comma-separated (knowledge.publish, "
                           "knowledge.assess, knowledge.retract); the peer must take the type filter")
    add_arguments(sync, include_serve_only=False)
    sync.set_defaults(handler=cmd_sync)


def _state_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", metavar="DIR", default="./akrelay-data", help="the relay's data directory")
    parser.add_argument("--store", metavar="URL", default=None,
                        help="a deployment's Redis (redis://HOST:PORT/DB): use its shared sync state instead "
                             "[env AKRELAY_STORE]")
    parser.add_argument("--store-namespace", metavar="NAME", default=None,
                        help="the deployment's key prefix in that Redis [env AKRELAY_STORE_NAMESPACE; "
                             "default akrelay]")


def _backend(args: argparse.Namespace) -> Backend:
    """The node's backend for ``--data``/``--store``/``--store-namespace`` (and their ``AKRELAY_*`` variables):
    it keeps the federation state (a data directory's file, or a deployment's Redis); built, nothing opened."""
    from akrelay.backend import backend_for
    from akrelay.settings import load_settings

    given = {name: getattr(args, name) for name in ("data", "store", "store_namespace")
             if getattr(args, name, None) is not None}
    env = {name: os.environ[name] for name in ("AKRELAY_STORE", "AKRELAY_STORE_NAMESPACE") if name in os.environ}
    return backend_for(load_settings(given, env))


def _need_file(args: argparse.Namespace) -> Path:
    if not args.file:
        raise SystemExit("akrelay peers: --file FILE is required for this action")
    return Path(args.file)


def _fail(message: str) -> int:
    print(f"akrelay peers: {message}", file=sys.stderr)
    return 2


def cmd_list(args: argparse.Namespace) -> int:
    from akrelay.federation.peers import PeerConfigError, load_peers

    try:
        peer_file = load_peers(_need_file(args), missing_ok=True)
    except PeerConfigError as exc:
        return _fail(str(exc))
    if args.json:
        from dataclasses import asdict

        print(json.dumps([asdict(p) for p in peer_file.peers], indent=2))
        return 0
    if not peer_file.peers:
        print("no peers configured")
    for p in peer_file.peers:
        flags = [] if p.enabled else ["disabled"]
        if p.allow_private:
            flags.append("allow-private")
        if p.ca_file:
            flags.append(f"ca-file={p.ca_file}")
        print(f"{p.origin}  interval={p.interval:g}s page-limit={p.page_limit}" + (" " + " ".join(flags) if flags else ""))
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    from akrelay.federation.peers import PeerConfigError, load_peers, make_peer, save_peers, with_changes

    path = _need_file(args)
    try:
        peer_file = load_peers(path, missing_ok=True)
        ca_file = str(Path(args.ca_file).resolve()) if args.ca_file else None
        if ca_file is not None and not Path(ca_file).is_file():
            return _fail(f"CA file {args.ca_file} does not exist")
        options = dict(ca_file=ca_file, allow_private=args.allow_private, interval=args.interval,
                       page_limit=args.page_limit, max_page_bytes=args.max_page_bytes,
                       enabled=False if args.disabled else None, push=args.push, offer=args.offer)
        existing = peer_file.get(args.origin)
        peer = with_changes(existing, **options) if existing else make_peer(args.origin, **options)
        created = peer_file.add(peer)
        save_peers(path, peer_file)
    except PeerConfigError as exc:
        return _fail(str(exc))
    print(f"{'added' if created else 'updated'} {peer.origin}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from akrelay.federation.peers import PeerConfigError, load_peers, save_peers

    path = _need_file(args)
    try:
        peer_file = load_peers(path)
        if not peer_file.remove(args.origin):
            return _fail(f"{args.origin} is not in {path}")
        save_peers(path, peer_file)
    except PeerConfigError as exc:
        return _fail(str(exc))
    print(f"removed {args.origin}")
    return 0


def _when(ms: object) -> str:
    if not ms or not isinstance(ms, (int, float)):
        return "never"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def cmd_status(args: argparse.Namespace) -> int:
    from akrelay.federation.peers import PeerConfigError, load_peers
    from akrelay.federation.state import FederationState, PeerState, StateStore
    from akrelay.settings import SettingsError
    from akrelay.store.base import StoreUnavailable

    try:
        backend = _backend(args)
    except SettingsError as exc:
        return _fail(str(exc))
    kept = backend.federation_state()  # None: a data directory that has not synced yet
    if kept is None and not args.file:
        backend.close()
        return _fail(f"no sync state in {args.data} (has the relay synced yet?)")
    state: StateStore = kept if kept is not None else FederationState()
    try:
        states = {s.origin: s for s in state.all()}
        if args.file:
            try:
                for p in load_peers(args.file).peers:
                    states.setdefault(p.origin, PeerState(p.origin))
            except PeerConfigError as exc:
                return _fail(str(exc))
        pending = {o: state.pending_count(o) for o in states}
    except StoreUnavailable as exc:
        return _fail(str(exc))
    finally:
        state.close()
        backend.close()
    if args.json:
        print(json.dumps([s.to_json() | {"pending": pending[o]} for o, s in sorted(states.items())], indent=2))
        return 0
    for origin, s in sorted(states.items()):
        print(origin)
        print(f"  checkpoint    {s.checkpoint} (peer at {s.peer_checkpoint}, lag {s.lag})")
        if s.resume_seq:
            print(f"  resumes after seq {s.resume_seq} (kept from an unfinished pass)")
        print(f"  last success  {_when(s.last_success)}")
        print(f"  news          {s.push or 'polled'}")
        print(f"  last error    {s.last_error or '-'}")
        if s.misbehaving:
            print(f"  MISBEHAVING   {s.misbehaving} (not pulled from; evidence in `peers status --json`; "
                  "`peers clear` to sync again)")
        if s.cleared:
            print(f"  cleared       {len(s.cleared)} time(s), last {_when(s.cleared[-1].get('cleared_at'))} "
                  f"({s.cleared[-1].get('misbehaving')})")
        if s.last_batch_error:
            print(f"  batch error   {s.last_batch_error}")
        if s.reconcile_note:
            from akrelay.cli.terminal import printable

            print(f"  reconcile     {printable(s.reconcile_note, keep='')} ({_when(s.last_reconcile)})")
        if s.retry_at and s.retry_at > time.time() * 1000:
            print(f"  backing off   until {_when(s.retry_at)}")
        print(f"  pending       {pending[origin]}")
        print("  counts        " + " ".join(f"{k}={v}" for k, v in s.counts.items()))
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from akrelay.federation.state import StateStore
    from akrelay.settings import SettingsError
    from akrelay.store.base import StoreUnavailable

    try:
        backend = _backend(args)
    except SettingsError as exc:
        return _fail(str(exc))
    kept = backend.federation_state()
    if kept is None:
        backend.close()
        return _fail(f"no sync state in {args.data} (has the relay synced yet?)")
    state: StateStore = kept
    try:
        known = {s.origin: s for s in state.all()}
        origin = args.origin.rstrip("/")
        if origin not in known and "https://" + origin in known:
            origin = "https://" + origin
        if origin not in known:
            return _fail(f"{args.origin} has no sync state here (see `akrelay peers status`)")
        cleared = state.clear_misbehaving(origin, int(time.time() * 1000))
    except (StoreUnavailable, RuntimeError) as exc:
        return _fail(str(exc))
    finally:
        state.close()
        backend.close()
    if cleared is None:
        print(f"akrelay peers: {origin} is not marked misbehaving: nothing to clear", file=sys.stderr)
        return 1
    archived = cleared.cleared[-1]
    if args.json:
        print(json.dumps(cleared.to_json(), indent=2))
    else:
        print(f"cleared {origin}: it was misbehaving ({archived['misbehaving']}); the evidence is kept in its "
              f"state (`peers status --json`, \"cleared\" #{len(cleared.cleared)}); the next pass re-verifies its "
              "log from size 0 and re-enumerates its records from the start")
    return 0


def _reconcile(settings: Settings, node: RelayNode, only: str | None, args: argparse.Namespace | None = None) -> int:
    """``akrelay sync --reconcile``: progress on stderr, one summary line per peer on stdout."""
    from akrelay.federation.peers import PeerConfigError
    from akrelay.federation.reconcile import ReconcileResult, parse_filter
    from akrelay.federation.runner import reconcile_once
    from akrelay.cli.terminal import printable
    from akrelay.protocol.errors import ProtocolError

    pairs = [(name, value) for name, value in (("since", getattr(args, "since", None)),
                                                ("until", getattr(args, "until", None)),
                                                ("type", getattr(args, "types", None))) if value is not None]
    try:
        window = parse_filter(pairs)
    except ProtocolError as exc:
        print(f"akrelay sync: --since/--until/--type: {exc.message}", file=sys.stderr)
        return 2

    def safe(text: str) -> str:
        return printable(text, keep="")

    def progress(r: ReconcileResult) -> None:
        print(f"  {safe(r.origin)}: round {r.rounds}, have {r.have}, need {r.need}, "
              f"{r.sent + r.received:,} bytes, {r.batches} batch fetch(es)", file=sys.stderr)

    try:
        results = reconcile_once(settings, node.relay, node.sync.leadership(), only=only, progress=progress,
                                 window=window)
    except (PeerConfigError, RuntimeError, ValueError) as exc:
        print(f"akrelay sync: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for r in results:
        print(f"{safe(r.origin)}: {safe(r.summary())}")
        failed += int(r.supported and not r.complete)
    return 1 if failed else 0


def cmd_sync(args: argparse.Namespace) -> int:
    from akrelay.federation.peers import PeerConfigError
    from akrelay.settings import SettingsError, load_settings, with_data_origin

    try:
        settings = with_data_origin(load_settings(args))
    except SettingsError as exc:
        print(f"akrelay sync: {exc}", file=sys.stderr)
        return 2
    if not settings.federation.peers:
        print("akrelay sync: --peers FILE is required", file=sys.stderr)
        return 2
    settings = settings.replace(data=str(settings.data_dir.resolve()))
    from akrelay.node import RelayNode

    try:
        node = RelayNode.open(settings, components=("sync",))
    except (SettingsError, PeerConfigError) as exc:
        print(f"akrelay sync: {exc}", file=sys.stderr)
        return 2
    try:
        if getattr(args, "reconcile", False):
            return _reconcile(settings, node, args.peer, args)
        if any(getattr(args, n, None) is not None for n in ("since", "until", "types")):
            print("akrelay sync: --since, --until and --type narrow --reconcile only", file=sys.stderr)
            return 2
        if not args.once:
            node.start()
            try:
                while node.sync.wait(1.0):
                    pass
            except KeyboardInterrupt:
                pass
            return 0
        try:
            results = node.sync.run_once()
        except (PeerConfigError, RuntimeError) as exc:
            print(f"akrelay sync: {exc}", file=sys.stderr)
            return 2
        skipped = node.sync.skipped_self()
    finally:
        node.stop()
    source = "--origin" if settings.sources.get("origin") == "flag" else f"the origin of {settings.data_dir}"
    for origin in skipped:
        print(f"akrelay sync: warning: not syncing from {origin}: it is this relay's own origin ({source}); "
              "pass --origin with this relay's public origin if that is wrong", file=sys.stderr)
    if skipped and not results:
        print("akrelay sync: no peer to sync from", file=sys.stderr)
        return 1
    failed = 0
    for r in results:
        if r.ok:
            print(f"{r.origin}: ok, checkpoint {r.checkpoint}, {r.pages} page(s), accepted {r.accepted}, "
                  f"duplicates {r.duplicates}, rejected {r.rejected}, resolved {r.resolved}, pending {r.pending}")
        else:
            failed += 1
            print(f"{r.origin}: {'skipped (backing off)' if r.skipped else 'failed'}: {r.error}")
    return 1 if failed else 0
