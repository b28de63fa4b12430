"""Range-based set reconciliation at scale (issue 26): rounds and bytes against a full pull.

Two sides hold the same N items (``(created_at, event hash)``) except for D that only the
responder lacks (and, with ``--both``, D more that only the initiator lacks). The two
:class:`akrelay.protocol.reconcile.Reconciler` run in one process, each over its own
:class:`SortedItems`, so the figures are the protocol's own: round trips, bytes on the wire
each way, the largest message, and the CPU time of both sides (building the sorted views
is reported apart). The ratio compares the bytes to the least a full pull could cost:
N event hashes (32 bytes each), before any record is sent.

    python3 bench/bench_reconcile.py [--items 1000000] [--differences 1 100 10000] [--view memory|sqlite]

``--view sqlite`` runs both sides over the store-backed view (:mod:`akrelay.store.recon`) in
SQLite files with the relay's own reconciliation tables (schema version 3), built once
(reported apart); each round then reads the responder's precomputed aggregates within the
default budget, as ``POST /v1/knowledge/reconcile`` does; the initiator reads its own
aggregates and copies its set into memory once its rounds have read twice as many rows as
the set holds, as sync does (:class:`akrelay.store.recon.OwnSet`; ``--initiator snapshot``:
copy before the first message, ``view``: never; the copy is counted in the times). Wall time is per
reconciliation, not counting the build.

Last line: ``reconcile_bytes_1_diff: <bytes> bytes`` (for the smallest difference count).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from akrelay.protocol.reconcile import DEFAULT_FRAME_LIMIT, Reconciler, SortedItems  # noqa: E402


def sqlite_index(path: Path, items: list[tuple[int, bytes]]) -> tuple[Any, Any]:
    """A SQLite file holding only the reconciliation tables, filled with ``items``."""
    import sqlite3

    from akrelay.store.sqlite_recon import SCHEMA_V3, SqliteReconIndex, recon_add

    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    for statement in SCHEMA_V3.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("BEGIN")
    for start in range(0, len(items), 50_000):
        recon_add(conn, items[start:start + 50_000])
    conn.execute("COMMIT")
    return SqliteReconIndex(lambda: conn), conn


#: --split and --list-below (the in-memory run's Reconciler options)
OPTIONS: dict[str, Any] = {}


def run(items: int, differences: int, both: bool, frame_limit: int) -> dict[str, float]:
    rng = random.Random(differences)
    start_ms = 1_760_000_000_000
    base = [(start_ms + rng.randrange(365 * 86_400_000), hashlib.sha256(i.to_bytes(8, "big")).digest())
            for i in range(items)]
    dropped = set(rng.sample(range(items), differences))
    responder_items = [item for i, item in enumerate(base) if i not in dropped]
    initiator_items = base
    if both:
        extra = [(start_ms + rng.randrange(365 * 86_400_000), hashlib.sha256(b"x" + i.to_bytes(8, "big")).digest())
                 for i in range(differences)]
        responder_items += extra
    t0 = time.process_time()
    initiator = Reconciler(SortedItems(initiator_items), frame_limit=frame_limit, **OPTIONS)
    responder = Reconciler(SortedItems(responder_items), frame_limit=frame_limit, **OPTIONS)
    initiator.initiator_asks = True  # as with the default list_below
    build = time.process_time() - t0

    t0 = time.process_time()
    message: bytes | None = initiator.initiate()
    sent = received = largest = rounds = 0
    have = need = 0
    while message is not None:
        sent += len(message)
        reply = responder.respond(message)
        received += len(reply)
        largest = max(largest, len(message), len(reply))
        rounds += 1
        outcome = initiator.reconcile(reply)
        have += len(outcome.have)
        need += len(outcome.need)
        message = outcome.message
    cpu = time.process_time() - t0
    assert have == differences and need == (differences if both else 0), (have, need)
    return {"rounds": rounds, "sent": sent, "received": received, "largest": largest, "cpu_ms": cpu * 1000,
            "build_s": build, "ratio": (sent + received) / (32 * items)}


_BASE: dict[int, tuple[Path, list[tuple[int, bytes]]]] = {}


def run_store(items: int, differences: int, both: bool, directory: Path, initiator_view: str = "adaptive") -> dict[str, float]:
    """As :func:`run`, both sides over the store-backed view in SQLite.

    The N items are indexed once (the initiator's file); each responder is a copy of it
    without the D items (and with D of its own, ``--both``), so the build is paid once.
    """
    import shutil
    import sqlite3

    from akrelay.federation.reconcile import respond
    from akrelay.store.recon import COPY_AFTER, OwnSet
    from akrelay.store.sqlite_recon import SqliteReconIndex, recon_add, recon_discard

    start_ms = 1_760_000_000_000
    t0 = time.perf_counter()
    if items not in _BASE:
        rng0 = random.Random(0)
        base = [(start_ms + rng0.randrange(365 * 86_400_000), hashlib.sha256(i.to_bytes(8, "big")).digest())
                for i in range(items)]
        path = directory / f"initiator-{items}.sqlite3"
        if not path.exists():  # --keep DIR: an index built by an earlier run is reused
            partial = path.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            _, conn = sqlite_index(partial, base)
            conn.close()
            partial.rename(path)
        _BASE[items] = (path, base)
    path, base = _BASE[items]
    rng = random.Random(differences)
    dropped = [base[i] for i in rng.sample(range(items), differences)]
    copy = directory / f"responder-{differences}.sqlite3"
    shutil.copyfile(path, copy)
    c2 = sqlite3.connect(copy, isolation_level=None, check_same_thread=False)
    c2.execute("BEGIN")
    recon_discard(c2, dropped)
    if both:
        recon_add(c2, [(start_ms + rng.randrange(365 * 86_400_000), hashlib.sha256(b"x" + i.to_bytes(8, "big")).digest())
                       for i in range(differences)])
    c2.execute("COMMIT")
    c1 = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    ours, theirs = SqliteReconIndex(lambda: c1), SqliteReconIndex(lambda: c2)
    build = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    # the initiator's own set as sync's learn() reads it (the aggregates, copied once the rounds
    # prove many), always copied first, or never copied
    own = OwnSet(ours, copy_after={"adaptive": COPY_AFTER, "snapshot": 0.0, "view": float("inf")}[initiator_view])
    with ours.recon_snapshot():
        initiator = Reconciler(own.storage())
        message: bytes | None = initiator.initiate()
    sent = received = largest = rounds = 0
    have = need = 0
    while message is not None:
        sent += len(message)
        reply = respond(theirs, message)
        received += len(reply)
        largest = max(largest, len(message), len(reply))
        rounds += 1
        with ours.recon_snapshot():
            initiator.storage = own.storage()
            outcome = initiator.reconcile(reply)
        have += len(outcome.have)
        need += len(outcome.need)
        message = outcome.message
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"    initiator: {own.view_reads:,} rows read from its aggregates, "
          f"{'copied its set' if own.copy is not None else 'no copy'}", file=sys.stderr)
    c1.close()
    c2.close()
    copy.unlink()
    assert have == differences and need == (differences if both else 0), (have, need)
    return {"rounds": rounds, "sent": sent, "received": received, "largest": largest, "cpu_ms": cpu * 1000,
            "wall_ms": wall * 1000, "build_s": build, "ratio": (sent + received) / (32 * items)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--differences", type=int, nargs="+", default=[1, 100, 10_000])
    parser.add_argument("--both", action="store_true", help="differences on both sides")
    parser.add_argument("--frame-limit", type=int, default=DEFAULT_FRAME_LIMIT)
    parser.add_argument("--view", choices=("memory", "sqlite"), default="memory",
                        help="sorted lists in memory, or the store-backed view over SQLite (wall ms)")
    parser.add_argument("--initiator", choices=("adaptive", "snapshot", "view"), default="adaptive",
                        help="with --view sqlite: the initiator reads its aggregates and copies its set into memory "
                             "once the rounds prove many (as sync does), copies it before the first message, "
                             "or never copies it")
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="with --view sqlite: keep the initiator's index in DIR and reuse it next time")
    parser.add_argument("--split", choices=("aligned", "counts"), default="aligned",
                        help="in memory: split differing ranges at bucket boundaries (the default) or by counts")
    parser.add_argument("--list-below", type=int, default=None, help="in memory: the Reconciler's list_below")
    args = parser.parse_args()
    OPTIONS["aligned"] = args.split == "aligned"
    if args.list_below is not None:
        OPTIONS["list_below"] = args.list_below
    print(f"items {args.items:,}, frame limit {args.frame_limit:,} bytes, differences on "
          f"{'both sides' if args.both else 'one side'}, view {args.view}"
          f"{(', initiator ' + args.initiator) if args.view == 'sqlite' else ''}, load average "
          f"{' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
    print(f"{'diffs':>7} {'rounds':>6} {'sent B':>9} {'received B':>10} {'largest B':>9} "
          f"{'cpu ms':>8} {'vs hashes':>9}" + ("  wall ms" if args.view == "sqlite" else ""))
    first: dict[str, float] | None = None
    import tempfile

    scratch = tempfile.TemporaryDirectory(prefix="bench-reconcile-")
    directory = Path(args.keep) if args.keep else Path(scratch.name)
    directory.mkdir(parents=True, exist_ok=True)
    for d in args.differences:
        if args.view == "sqlite":
            r = run_store(args.items, d, args.both, directory, args.initiator)
        else:
            r = run(args.items, d, args.both, args.frame_limit)
        first = first or r
        print(f"{d:>7,} {r['rounds']:>6} {r['sent']:>9,} {r['received']:>10,} {r['largest']:>9,} "
              f"{r['cpu_ms']:>8.1f} {r['ratio']:>9.2e}" + (f" {r['wall_ms']:>8.1f}" if "wall_ms" in r else "")
              + f"   (views built in {r['build_s']:.1f} s)")
    assert first is not None
    print(f"reconcile_bytes_{args.differences[0]}_diff: {int(first['sent'] + first['received'])} bytes")


if __name__ == "__main__":
    main()
