"""Range-based set reconciliation at scale (issue 26): rounds and bytes against a full pull.

Two sides hold the same N items (``(created_at, event hash)``) except for D that only the
responder lacks (and, with ``--both``, D more that only the initiator lacks). The two
:class:`akrelay.protocol.reconcile.Reconciler` run in one process, each over its own
:class:`SortedItems`, so the figures are the protocol's own: round trips, bytes on the wire
each way, the largest message, and the CPU time of both sides (building the sorted views
is reported apart). The ratio compares the bytes to the least a full pull could cost:
N event hashes (32 bytes each), before any record is sent.

    python3 bench/bench_reconcile.py [--items 1000000] [--differences 1 100 10000] [--view memory|sqlite|redis ...]

``--view sqlite`` runs both sides over the store-backed view (:mod:`akrelay.store.recon`) in
SQLite files with the relay's own reconciliation tables (schema version 3), built once
(reported apart); each round then reads the responder's precomputed aggregates within the
default budget, as ``POST /v1/knowledge/reconcile`` does; the initiator reads its own
aggregates and copies its set into memory once its rounds have read twice as many rows as
the set holds, as sync does (:class:`akrelay.store.recon.OwnSet`; ``--initiator snapshot``:
copy before the first message, ``view``: never; the copy is counted in the times). Wall time is per
reconciliation, not counting the build.

``--view redis`` runs the responder over the Redis index instead (:mod:`akrelay.store.redis.recon`, the
view a relay on ``--store redis://`` answers ``POST /v1/knowledge/reconcile`` from, through a
:class:`RedisStore` of an empty log, so each message pays the index's catch-up check as served), the
initiator over the same SQLite file as ``--view sqlite``. The N items are added once to a namespace of
``--redis URL`` (else a ``redis-server`` of its own, no persistence, on a free port, stopped at the end);
for each D the dropped items are removed and put back after. Besides the wall and CPU time of this
process it reports the CPU that ``redis-server`` spent (``INFO cpu`` before and after) and the Redis
calls per reconciliation. Several views (``--view sqlite redis``) run one after the other for each D,
so they meet the same load.

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


class Calls:
    """A :class:`RedisStore` observer: the Redis calls of a reconciliation, by name, with their wall time."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def call(self, name: str, seconds: float) -> None:
        self.count[name] = self.count.get(name, 0) + 1
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def outage(self) -> None:
        raise RuntimeError("Redis outage during the bench")

    def describe(self) -> str:
        return ", ".join(f"{name} {n:,} ({1000 * self.seconds[name]:.0f} ms)" for name, n in sorted(self.count.items()))


class RedisSide:
    """The responder's index in Redis: the N items added once, each run's differences applied and undone."""

    def __init__(self, url: str, items: int, base: list[tuple[int, bytes]]) -> None:
        import redis

        from akrelay.store.redis.store import RedisStore

        self.namespace = f"bench-reconcile-{items}"
        self.admin = redis.Redis.from_url(url)
        stale = list(self.admin.scan_iter(match=self.namespace + ":*", count=10_000))
        for start in range(0, len(stale), 1000):
            self.admin.unlink(*stale[start:start + 1000])
        self.store = RedisStore(url, namespace=self.namespace, text_indexer=False)
        t0 = time.perf_counter()
        for start in range(0, len(base), 10_000):
            self.store.recon.add(base[start:start + 10_000])
        self.build_s = time.perf_counter() - t0
        memory = self.admin.info("memory")
        print(f"    redis: {items:,} items indexed in {self.build_s:.1f} s, used_memory "
              f"{memory['used_memory'] / 2**20:.0f} MiB", file=sys.stderr)

    def server_cpu(self) -> float:
        info = self.admin.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def close(self, clean: bool = True) -> None:
        """``clean``: remove the bench's keys (UNLINK: freed in the background; a server of its own is just stopped)."""
        if clean:
            keys = list(self.admin.scan_iter(match=self.namespace + ":*", count=10_000))
            for start in range(0, len(keys), 1000):
                self.admin.unlink(*keys[start:start + 1000])
        self.store.close()
        self.admin.close()


_REDIS: dict[int, RedisSide] = {}


def run_store(items: int, differences: int, both: bool, directory: Path, initiator_view: str = "adaptive",
              responder_view: str = "sqlite", redis_url: str | None = None) -> dict[str, float]:
    """As :func:`run`, both sides over the store-backed view in SQLite (``responder_view="redis"``: the
    responder over the Redis index of ``redis_url``).

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
    extra = ([(start_ms + rng.randrange(365 * 86_400_000), hashlib.sha256(b"x" + i.to_bytes(8, "big")).digest())
              for i in range(differences)] if both else [])
    c1 = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    ours = SqliteReconIndex(lambda: c1)
    theirs: Any
    redis_side: RedisSide | None = None
    calls = Calls()
    if responder_view == "redis":
        assert redis_url is not None
        if items not in _REDIS:
            _REDIS[items] = RedisSide(redis_url, items, base)
        redis_side = _REDIS[items]
        redis_side.store.recon.discard(dropped)
        redis_side.store.recon.add(extra)
        redis_side.store.observer = calls
        theirs = redis_side.store.recon
    else:
        copy = directory / f"responder-{differences}.sqlite3"
        shutil.copyfile(path, copy)
        c2 = sqlite3.connect(copy, isolation_level=None, check_same_thread=False)
        c2.execute("BEGIN")
        recon_discard(c2, dropped)
        if extra:
            recon_add(c2, extra)
        c2.execute("COMMIT")
        theirs = SqliteReconIndex(lambda: c2)
    build = time.perf_counter() - t0
    server0 = redis_side.server_cpu() if redis_side is not None else 0.0
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
    server = (redis_side.server_cpu() - server0) if redis_side is not None else 0.0
    print(f"    initiator: {own.view_reads:,} rows read from its aggregates, "
          f"{'copied its set' if own.copy is not None else 'no copy'}", file=sys.stderr)
    c1.close()
    if redis_side is not None:
        print(f"    redis calls: {calls.describe()}", file=sys.stderr)
        redis_side.store.observer = Calls()
        redis_side.store.recon.discard(extra)
        redis_side.store.recon.add(dropped)
    else:
        c2.close()
        copy.unlink()
    assert have == differences and need == (differences if both else 0), (have, need)
    return {"rounds": rounds, "sent": sent, "received": received, "largest": largest, "cpu_ms": cpu * 1000,
            "wall_ms": wall * 1000, "build_s": build, "ratio": (sent + received) / (32 * items),
            "server_ms": server * 1000, "calls": sum(calls.count.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--differences", type=int, nargs="+", default=[1, 100, 10_000])
    parser.add_argument("--both", action="store_true", help="differences on both sides")
    parser.add_argument("--frame-limit", type=int, default=DEFAULT_FRAME_LIMIT)
    parser.add_argument("--view", choices=("memory", "sqlite", "redis"), nargs="+", default=["memory"],
                        help="sorted lists in memory, the store-backed view over SQLite (wall ms), or the responder "
                             "over the Redis index (the initiator on SQLite); several: each D runs each, in turn")
    parser.add_argument("--redis", metavar="URL", default=None,
                        help="with --view redis: this Redis (keys under bench-reconcile-N: only); default: a "
                             "redis-server of its own without persistence, on a free port")
    parser.add_argument("--initiator", choices=("adaptive", "snapshot", "view"), default="adaptive",
                        help="with --view sqlite|redis: the initiator reads its aggregates and copies its set into memory "
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
    import os

    stored = [v for v in args.view if v != "memory"]
    print(f"items {args.items:,}, frame limit {args.frame_limit:,} bytes, differences on "
          f"{'both sides' if args.both else 'one side'}, view {' '.join(args.view)}"
          f"{(', initiator ' + args.initiator) if stored else ''}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(f"{'view':>6} {'diffs':>7} {'rounds':>6} {'sent B':>9} {'received B':>10} {'largest B':>9} "
          f"{'cpu ms':>8} {'vs hashes':>9}" + ("  wall ms  redis-server cpu ms  redis calls" if stored else ""),
          flush=True)
    first: dict[str, float] | None = None
    import contextlib
    import tempfile

    scratch = tempfile.TemporaryDirectory(prefix="bench-reconcile-")
    directory = Path(args.keep) if args.keep else Path(scratch.name)
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        redis_url = args.redis
        if "redis" in args.view and redis_url is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from redis_server import RedisServer

            server = RedisServer(Path(scratch.name) / "redis", appendonly=False).start()
            stack.callback(server.stop)
            redis_url = server.url
        stack.callback(lambda: [side.close(clean=args.redis is not None) for side in _REDIS.values()])
        for d in args.differences:
            for view in args.view:
                if view == "memory":
                    r = run(args.items, d, args.both, args.frame_limit)
                else:
                    r = run_store(args.items, d, args.both, directory, args.initiator, view, redis_url)
                first = first or r
                print(f"{view:>6} {d:>7,} {r['rounds']:>6} {r['sent']:>9,} {r['received']:>10,} {r['largest']:>9,} "
                      f"{r['cpu_ms']:>8.1f} {r['ratio']:>9.2e}"
                      + (f" {r['wall_ms']:>8.1f} {r['server_ms']:>20.1f} {r['calls']:>12,}" if "wall_ms" in r else "")
                      + f"   (views built in {r['build_s']:.1f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    assert first is not None
    print(f"reconcile_bytes_{args.differences[0]}_diff: {int(first['sent'] + first['received'])} bytes")


if __name__ == "__main__":
    main()
