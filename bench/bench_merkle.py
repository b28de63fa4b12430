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

With ``--baseline-src DIR`` (the ``src`` directory of another akrelay, e.g. from
``git archive <commit> src``), the same filled file is copied, and the back-fill
and the proofs run on each copy in turn, once with that code and once with this
one, each in its own child process (same file, same machine state), and the
ratios are printed: old and new side by side in one run.

Usage: python bench/bench_merkle.py [--records 1000000] [--proofs 2000] [--data DIR] [--baseline-src DIR]
Last line: ``merkle_proof_p99: <ms> ms`` (this code's worse of inclusion and consistency).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
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


def backfill_phase(path: Path) -> dict[str, float]:
    """Open the file as an upgrade does and back-fill its log (in a child process: the code under test)."""
    import akrelay

    store = SqliteStore(path, merkle_log=False)
    t0, c0 = time.perf_counter(), time.process_time()
    last = [t0]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 5 or done == total:
            last[0] = time.perf_counter()
            print(f"  back-fill {done:,}/{total:,}", file=sys.stderr, flush=True)

    added = store.backfill_log(progress)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = store.log_size()
    store.close()
    assert added == n
    return {"added": added, "wall": wall, "cpu": cpu, "code": str(Path(akrelay.__file__).parent)}


def proofs_phase(path: Path, proofs: int) -> dict[str, float]:
    """Random inclusion and consistency proofs at the full size, timed one by one (verified for a sample)."""
    store = SqliteStore(path)
    n = store.log_size()
    root = merkle.root_hash(n, store.log_nodes)
    rng = random.Random(23)
    rss_before = rss_mb()
    incl, cons, cpu = [], [], []
    for k in range(proofs):
        i = rng.randrange(n)
        t, c = time.perf_counter(), time.thread_time()
        proof = merkle.inclusion_proof(i, n, store.log_nodes)
        incl.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
        if k < 50:
            entry = store.log_entries(i, 1)[0]
            assert merkle.verify_inclusion(i, n, leaf_of(entry.seq, entry.hash), proof, root)
        m = rng.randint(1, n - 1)
        t, c = time.perf_counter(), time.thread_time()
        cproof = merkle.consistency_proof(m, n, store.log_nodes)
        cons.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
        if k < 20:
            assert merkle.verify_consistency(m, n, merkle.root_hash(m, store.log_nodes), root, cproof)
    store.close()
    return {"size": n, "root": root.hex(), "incl_p50": percentile(incl, 0.5), "incl_p99": percentile(incl, 0.99),
            "cons_p50": percentile(cons, 0.5), "cons_p99": percentile(cons, 0.99),
            "cpu_p50": percentile(cpu, 0.5), "cpu_p99": percentile(cpu, 0.99),
            "rss_before": rss_before, "rss_after": rss_mb()}


def child(phase: str, path: Path, proofs: int, src: str | None) -> dict[str, float]:
    """Run one phase in a fresh interpreter, with ``src`` first on the path (the baseline) or this akrelay."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, str(Path(__file__).parent)])
    args = [sys.executable, __file__, "--phase", phase, "--path", str(path), "--proofs", str(proofs)]
    out = subprocess.run(args, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--proofs", type=int, default=2000)
    parser.add_argument("--data", default=None, help="directory for the store (default: a temporary one)")
    parser.add_argument("--baseline-src", default=None, help="another akrelay's src directory to compare with")
    parser.add_argument("--phase", choices=["backfill", "proofs"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        phase = backfill_phase(Path(args.path)) if args.phase == "backfill" else proofs_phase(Path(args.path), args.proofs)
        print(json.dumps(phase))
        return 0
    tmp = tempfile.TemporaryDirectory(prefix="akrelay-bench-merkle-") if args.data is None else None
    path = Path(args.data or tmp.name) / "relay.sqlite3"  # type: ignore[union-attr]
    print(f"bench_merkle: {os.cpu_count()} CPUs, {args.records:,} records, {args.proofs} proofs of each kind",
          flush=True)
    started = time.perf_counter()
    fill(path, args.records)
    print(f"  filled {args.records:,} placeholder records in {time.perf_counter() - started:.1f} s", flush=True)
    sides: list[tuple[str, Path, str | None]] = [("new", path, None)]
    if args.baseline_src:
        old = path.with_name("baseline.sqlite3")
        shutil.copyfile(path, old)
        conn = sqlite3.connect(old)  # the log tables are empty, so the file is also a valid version-3 file
        conn.execute("PRAGMA user_version = 3")
        conn.commit()
        conn.close()
        sides.insert(0, ("old", old, args.baseline_src))
    fills, proofs = {}, {}
    for name, where, src in sides:
        fills[name] = got = child("backfill", where, args.proofs, src)
        # CPU time too: on a shared machine the wall clock measures the neighbours (load average shown)
        print(f"  {name} ({got['code']}): back-fill {got['added'] / got['wall']:,.0f} records/s wall "
              f"({got['wall']:.1f} s), {got['added'] / got['cpu']:,.0f} records/s of CPU ({got['cpu']:.1f} s); "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for name, where, src in sides:
        proofs[name] = got = child("proofs", where, args.proofs, src)
        print(f"  {name}: inclusion proofs at size {got['size']:,}: p50 {got['incl_p50']:.3f} ms, "
              f"p99 {got['incl_p99']:.3f} ms; consistency p50 {got['cons_p50']:.3f} ms, p99 {got['cons_p99']:.3f} ms; "
              f"CPU per proof p50 {got['cpu_p50']:.3f} ms, p99 {got['cpu_p99']:.3f} ms; "
              f"peak RSS {got['rss_before']:.0f} MB before the proofs, {got['rss_after']:.0f} MB after; "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
    if "old" in fills:
        assert proofs["old"]["root"] == proofs["new"]["root"], "the two codes built different trees"
        o, n = fills["old"], fills["new"]
        print(f"  new/old: back-fill {o['wall'] / n['wall']:.2f}x wall, {o['cpu'] / n['cpu']:.2f}x CPU; "
              f"proof CPU p50 {proofs['new']['cpu_p50'] / proofs['old']['cpu_p50']:.2f}x, "
              f"p99 {proofs['new']['cpu_p99'] / proofs['old']['cpu_p99']:.2f}x (same root)")
    got = fills["new"]
    print(f"backfill_rate: {got['added'] / got['wall']:,.0f} records/s wall ({got['wall']:.1f} s), "
          f"{got['added'] / got['cpu']:,.0f} records/s of CPU ({got['cpu']:.1f} s)", flush=True)
    if tmp is not None:
        tmp.cleanup()
    print(f"merkle_proof_p99: {max(proofs['new']['incl_p99'], proofs['new']['cons_p99']):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
