"""The Merkle log's costs (issue 23): back-fill rate, and proof latency at 1M records.

A SQLite store is filled with ``--records`` (default 1,000,000) records written
straight into its ``records`` table (placeholder envelopes: the tree only reads
each record's ``seq`` and event hash), as a data directory from before the log
would be; then :meth:`SqliteStore.backfill_log` builds the tree, as opening an
upgraded directory does (rate in records/s, goal >= 50k/s). Then random
inclusion proofs (at the full size) and consistency proofs (random first size)
are generated from the stored nodes, through the store's read connection, and
timed one by one (p50/p99, goal p99 <= 5 ms), with the process's peak RSS
before and after the proofs (memory flat in the log's size: nothing is loaded).

Usage: python bench/bench_merkle.py [--records 1000000] [--proofs 2000] [--data DIR]
Last line: ``merkle_proof_p99: <ms> ms`` (the worse of inclusion and consistency).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from akrelay.protocol import merkle
from akrelay.store.sqlite import SqliteStore
from akrelay.store.tlog import leaf_of


def b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def fill(path: Path, count: int) -> None:
    """``count`` placeholder records, then the log tables emptied: a directory from before the log."""
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous = OFF")
    sig = "A" * 86
    batch = []
    for seq in range(1, count + 1):
        eid = b64(hashlib.sha256(seq.to_bytes(8, "big")).digest())
        body = ('{"event":{},"hash":"' + eid + '","signature":"' + sig + '"}').encode()
        batch.append((seq, eid, 1, 1, 0, "", body))
        if len(batch) == 50000:
            conn.executemany("INSERT INTO records (seq, id, accepted_at, created_at, withheld, text, body) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", batch)
            batch = []
    conn.executemany("INSERT INTO records (seq, id, accepted_at, created_at, withheld, text, body) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)", batch)
    conn.execute("UPDATE sequence SET hwm = ?", (count,))
    conn.execute("DELETE FROM log_entries")
    conn.execute("DELETE FROM log_nodes")
    conn.commit()
    conn.close()


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--proofs", type=int, default=2000)
    parser.add_argument("--data", default=None, help="directory for the store (default: a temporary one)")
    args = parser.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="akrelay-bench-merkle-") if args.data is None else None
    path = Path(args.data or tmp.name) / "relay.sqlite3"  # type: ignore[union-attr]
    print(f"bench_merkle: {os.cpu_count()} CPUs, {args.records:,} records, {args.proofs} proofs of each kind",
          flush=True)
    started = time.perf_counter()
    fill(path, args.records)
    print(f"  filled {args.records:,} placeholder records in {time.perf_counter() - started:.1f} s", flush=True)
    store = SqliteStore(path, merkle_log=False)
    t0, c0 = time.perf_counter(), time.process_time()
    last = [t0]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 5 or done == total:
            last[0] = time.perf_counter()
            print(f"  back-fill {done:,}/{total:,}", flush=True)

    added = store.backfill_log(progress)
    backfill, backfill_cpu = time.perf_counter() - t0, time.process_time() - c0
    n = store.log_size()
    assert added == n == args.records
    # CPU time too: on a shared machine the wall clock measures the neighbours (load average shown)
    print(f"backfill_rate: {added / backfill:,.0f} records/s wall ({backfill:.1f} s), {added / backfill_cpu:,.0f} "
          f"records/s of CPU ({backfill_cpu:.1f} s); load average {os.getloadavg()[0]:.1f}", flush=True)
    root = merkle.root_hash(n, store.log_nodes)
    rng = random.Random(23)
    rss_before = rss_mb()
    incl, cons, cpu = [], [], []
    for _ in range(args.proofs):
        i = rng.randrange(n)
        t, c = time.perf_counter(), time.thread_time()
        proof = merkle.inclusion_proof(i, n, store.log_nodes)
        incl.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
        if _ < 50:
            entry = store.log_entries(i, 1)[0]
            assert merkle.verify_inclusion(i, n, leaf_of(entry.seq, entry.hash), proof, root)
        m = rng.randint(1, n - 1)
        t, c = time.perf_counter(), time.thread_time()
        cproof = merkle.consistency_proof(m, n, store.log_nodes)
        cons.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
        if _ < 20:
            assert merkle.verify_consistency(m, n, merkle.root_hash(m, store.log_nodes), root, cproof)
    store.close()
    if tmp is not None:
        tmp.cleanup()
    print(f"  inclusion proofs at size {n:,}: p50 {percentile(incl, 0.5):.3f} ms, p99 {percentile(incl, 0.99):.3f} ms")
    print(f"  consistency proofs to size {n:,}: p50 {percentile(cons, 0.5):.3f} ms, p99 {percentile(cons, 0.99):.3f} ms")
    print(f"  CPU time per proof (either kind): p50 {percentile(cpu, 0.5):.3f} ms, p99 {percentile(cpu, 0.99):.3f} ms; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  peak RSS {rss_before:.0f} MB before the proofs, {rss_mb():.0f} MB after")
    print(f"merkle_proof_p99: {max(percentile(incl, 0.99), percentile(cons, 0.99)):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
