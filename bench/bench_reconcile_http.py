"""Reconciliation between two served relays over HTTPS (issue 26): rounds, bytes and where the time goes.

Both relays hold the same N events; the peer holds D more (really signed, submitted
through ``Relay.submit``) that the local relay lacks. The peer is served by ``akrelay
serve`` over TLS on 127.0.0.1; the local relay runs sync's own initiator against it:
:func:`akrelay.federation.reconcile.learn` (the rounds over ``POST
/v1/knowledge/reconcile``), then the ``need`` ids fetched with the batch read and ingested
by :meth:`SyncEngine.fetch_and_ingest` (verified and committed exactly as pulled events).
Reported per D: round trips, bytes on the wire (message bodies of the rounds; response
bodies of the fetches), the ratio of all of it to the bytes a full pull of the peer's
N + D records would take (D fetched records' average size times N + D), and the wall and
CPU time of each phase, on both sides (the server's CPU from ``/proc``).

The N common events are placeholder records written straight into both stores (their
signatures are never checked: reconciliation only reads the index, and none of them is
transferred), built once and cached under ``--cache`` (default ``/tmp``), with the
reconciliation tables filled in bulk. Both relays run with ``--no-merkle-log`` (the log's
back-fill of the placeholders is not what this measures).

    python bench/bench_reconcile_http.py [--items 1000000] [--differences 1 100 10000]

Last line: ``reconcile_http_transfer_cpu_share_<D>: <percent> %`` for the last D: the share of
the CPU time of both relays spent fetching, verifying and ingesting the missing events rather
than reconciling (goal: above 50 %); the wall-time share is printed in the table (on a loaded
machine it measures the neighbours as much as this).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_sync import free_port, make_event, start_serve, stop_serve  # noqa: E402

from akrelay.federation.peers import Peer  # noqa: E402
from akrelay.federation.reconcile import BATCH_IDS, ReconcileResult, event_id_of, learn  # noqa: E402
from akrelay.federation.state import FederationState  # noqa: E402
from akrelay.federation.sync import PassResult, SyncEngine, SyncOptions  # noqa: E402
from akrelay.protocol.signer import Signer  # noqa: E402
from akrelay.relay.config import RelayConfig  # noqa: E402
from akrelay.relay.core import open_relay  # noqa: E402
from akrelay.store.recon import bucket_deltas, to_limbs  # noqa: E402
from akrelay.store.recon_copy import KeptCopy  # noqa: E402
from akrelay.store.sqlite import SqliteStore  # noqa: E402
from akrelay.store.sqlite_recon import _LIMB_COLUMNS, _UPSERT  # noqa: E402
from akrelay.tls import ensure_self_signed  # noqa: E402

YEAR_MS = 365 * 86_400_000
START_MS = 1_760_000_000_000


def b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def build_base(path: Path, count: int) -> float:
    """``count`` placeholder records over a year and their reconciliation index, in bulk."""
    started = time.perf_counter()
    SqliteStore(path, merkle_log=False, text_indexer=False).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous = OFF")
    rng = random.Random(0)
    sig = "A" * 86
    rows, items = [], []
    for seq in range(1, count + 1):
        digest = hashlib.sha256(b"base" + seq.to_bytes(8, "big")).digest()
        eid = b64(digest)
        created = START_MS + rng.randrange(YEAR_MS)
        rows.append((seq, eid, created, created, 0, "", ('{"event":{},"hash":"' + eid + '","signature":"' + sig
                                                         + '"}').encode()))
        items.append((created, digest))
        if len(rows) == 50_000:
            conn.executemany("INSERT INTO records (seq, id, accepted_at, created_at, withheld, text, body) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            rows = []
    conn.executemany("INSERT INTO records (seq, id, accepted_at, created_at, withheld, text, body) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    items.sort()
    conn.executemany("INSERT INTO recon_items (created_at, hash) VALUES (?, ?)", items)
    buckets = [(shift, bucket, n, *to_limbs(total))
               for (shift, bucket), (n, total) in sorted(bucket_deltas(items, 1).items())]
    assert _LIMB_COLUMNS
    conn.executemany(_UPSERT, buckets)
    conn.execute("UPDATE sequence SET hwm = ?", (count,))
    conn.execute("UPDATE followers SET position = ? WHERE name = 'text_index'", (count,))
    conn.commit()
    conn.close()
    return time.perf_counter() - started


def copy_store(base: Path, data: Path) -> None:
    data.mkdir(parents=True)
    for f in base.parent.iterdir():
        if f.name.startswith(base.name) and not f.name.endswith(("-wal", "-shm", "lock")):
            shutil.copyfile(f, data / f.name.replace(base.name, "relay.sqlite3"))


def server_cpu(pgid: int) -> dict[int, float]:
    """User + system CPU seconds of each process of the server's group (launcher and worker), from /proc.

    Per process, without the CPU of reaped children: the follower processes of the peer fail
    on the placeholder records (they are no events) and are restarted every second; that
    loop is not what is measured, so only processes alive at both ends of a phase count.
    """
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid:
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def metric(origin: str, cert: Path, name: str) -> float:
    """One sample of the peer's ``/metrics`` (0 when absent)."""
    import ssl

    import httpx

    text = httpx.get(origin + "/metrics", verify=ssl.create_default_context(cafile=str(cert)), timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def wait_for_copy(origin: str, cert: Path, timeout: float = 600.0) -> float:
    """Seconds until the served peer's keeper has copied its set (its ``akrelay_reconcile_copies_total``)."""
    started = time.monotonic()
    while metric(origin, cert, "akrelay_reconcile_copies_total") < 1:
        if time.monotonic() - started > timeout:
            raise RuntimeError("the peer's kept copy was not made")
        time.sleep(0.1)  # a bench polls the server it measures; no test does
    return time.monotonic() - started


def run(base: Path, items: int, differences: int, work: Path, kept_copy: bool) -> dict[str, float]:
    peer_dir, local_dir = work / f"peer-{differences}", work / f"local-{differences}"
    copy_store(base, peer_dir)
    copy_store(base, local_dir)
    port = free_port()
    origin = f"https://127.0.0.1:{port}"
    relay = open_relay(peer_dir, RelayConfig(origin=origin), merkle_log=False, text_indexer=False)
    rng = random.Random(differences)
    signers = [Signer.from_seed(bytes([i + 1]) * 32) for i in range(20)]
    for i in range(differences):
        created = START_MS + rng.randrange(YEAR_MS)
        relay.submit(make_event(signers[i % 20], i // 20 + 1, created, rng))
    relay.close()
    cert = ensure_self_signed(peer_dir, origin).cert
    proc = start_serve(peer_dir, port, origin,
                       extra=["--no-merkle-log"] + ([] if kept_copy else ["--reconcile-copy-max", "0"]))
    kept = None
    try:
        peer_copy = wait_for_copy(origin, cert) if kept_copy else 0.0
        local = open_relay(local_dir, RelayConfig(origin="https://127.0.0.1:1"), merkle_log=False,
                           text_indexer=False)
        if kept_copy:  # as the node's sync component does when it starts: copy the set, keep it current
            kept = KeptCopy(local.store, local.store.recon)
            kept.start()
            assert kept.refresh(600) and kept.copies == 1, kept.status()
        state = FederationState.open_in(local_dir)
        peer = Peer(origin=origin, ca_file=str(cert), allow_private=True)
        engine = SyncEngine(local, state, [peer], SyncOptions(own_origin="https://127.0.0.1:1"))
        st = state.get(origin)
        pass_result = PassResult(origin)
        with engine.open_transport(peer) as transport:
            endpoints = engine.discover(peer, transport)
            result = ReconcileResult(origin)
            index = local.store.recon
            from_copy = metric(origin, cert, 'akrelay_reconcile_messages_total{answered_from="copy"}')
            w0, c0, s0 = time.perf_counter(), own_cpu(), server_cpu(proc.pid)
            caps = engine.reconcile_caps[origin]  # as sync does: the largest answers the peer advertises
            need = learn(transport, endpoints["reconcile"], index, result, deadline=3600.0,  # not the 120 s cap
                         answer_limit=caps.max_frame_limit, kept=kept)
            w1, c1, s1 = time.perf_counter(), own_cpu(), server_cpu(proc.pid)
            from_copy = metric(origin, cert, 'akrelay_reconcile_messages_total{answered_from="copy"}') - from_copy
            if kept_copy:  # every round answered from memory on both sides, or this measures something else
                assert from_copy == result.rounds and kept is not None and kept.answered >= 1, (from_copy, result)
            assert result.complete and len(need) == differences and result.have == 0, result
            read_before = transport.bytes_read
            for start in range(0, len(need), BATCH_IDS):
                ids = [event_id_of(i) for i in need[start:start + BATCH_IDS]]
                engine.fetch_and_ingest(peer, transport, endpoints["batch"], ids, st, pass_result)
            w2, c2, s2 = time.perf_counter(), own_cpu(), server_cpu(proc.pid)
            fetched = transport.bytes_read - read_before
            if kept is not None:  # the keeper takes in what was fetched: counted as reconciliation's cost
                assert kept.refresh(600)
                with local.store.recon.recon_snapshot():
                    from akrelay.store.recon import StoreView

                    assert kept.current(StoreView(local.store.recon)) is not None, kept.status()
            w3, c3 = time.perf_counter(), own_cpu()
        assert pass_result.accepted == differences, pass_result
        engine.close()
        state.close()
        local_copy = kept.last_copy_seconds if kept is not None else 0.0
        if kept is not None:
            kept.stop()
        local.close()
    finally:
        if kept is not None:
            kept.stop()
        stop_serve(proc)
    shutil.rmtree(peer_dir)
    shutil.rmtree(local_dir)
    per_record = fetched / differences
    full_pull = per_record * (items + differences)
    wire = result.sent + result.received + fetched
    return {"rounds": result.rounds, "sent": result.sent, "received": result.received, "fetched": fetched,
            "ratio": wire / full_pull, "recon_wall": w1 - w0, "recon_cpu": c1 - c0, "recon_server": spent(s0, s1),
            "fetch_wall": w2 - w1, "fetch_cpu": c2 - c1, "fetch_server": spent(s1, s2),
            "upkeep_wall": w3 - w2, "upkeep_cpu": c3 - c2, "peer_copy": peer_copy, "local_copy": local_copy,
            "share": (w2 - w1) / (w3 - w0),
            "cpu_share": ((c2 - c1) + spent(s1, s2)) / ((c3 - c0) + spent(s0, s1) + spent(s1, s2))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--differences", type=int, nargs="+", default=[1, 100, 10_000])
    parser.add_argument("--cache", default="/tmp", help="directory where the N-event store is kept between runs")
    parser.add_argument("--copy", choices=("both", "kept", "none"), default="both",
                        help="with the kept copy of each side's set (a serving relay's default), without it "
                             "(--reconcile-copy-max 0), or both side by side (the last line: the kept copy's)")
    args = parser.parse_args()
    base = Path(args.cache) / f"akrelay-bench-reconcile-{args.items}" / "base.sqlite3"
    if not base.exists():
        base.parent.mkdir(parents=True, exist_ok=True)
        partial = base.with_name("partial.sqlite3")
        for f in base.parent.glob("partial.sqlite3*"):
            f.unlink()
        took = build_base(partial, args.items)
        for f in base.parent.glob("partial.sqlite3*"):
            f.rename(base.parent / f.name.replace("partial.sqlite3", "base.sqlite3"))
        print(f"built the {args.items:,}-event store in {took:.1f} s (cached in {base.parent})", flush=True)
    print(f"items {args.items:,}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(f"{'diffs':>7} {'copy':>4} {'rounds':>6} {'recon B':>10} {'fetch B':>11} {'vs pull':>8} | "
          f"{'recon wall':>10} {'cpu here':>8} {'cpu peer':>8} | {'fetch wall':>10} {'cpu here':>8} "
          f"{'cpu peer':>8} | {'upkeep':>7} | transfer share: wall, CPU", flush=True)
    last = None
    modes = {"both": (False, True), "kept": (True,), "none": (False,)}[args.copy]
    with tempfile.TemporaryDirectory(prefix="bench-reconcile-http-") as tmp:
        for d in args.differences:
            for kept_copy in modes:
                r = run(base, args.items, d, Path(tmp), kept_copy)
                last = (d, r)
                print(f"{d:>7,} {'kept' if kept_copy else 'none':>4} {r['rounds']:>6} {r['sent'] + r['received']:>10,} "
                      f"{r['fetched']:>11,} {r['ratio']:>8.2e} | {r['recon_wall']:>9.2f}s {r['recon_cpu']:>7.2f}s "
                      f"{r['recon_server']:>7.2f}s | {r['fetch_wall']:>9.2f}s {r['fetch_cpu']:>7.2f}s "
                      f"{r['fetch_server']:>7.2f}s | {r['upkeep_cpu']:>6.2f}s | "
                      f"{100 * r['share']:.0f} %, {100 * r['cpu_share']:.0f} %   (load {os.getloadavg()[0]:.1f})",
                      flush=True)
                if kept_copy:
                    print(f"{'':>7} copies at start (not in the phases above): peer {r['peer_copy']:.2f} s "
                          f"(served, wall), here {r['local_copy']:.2f} s", flush=True)
    assert last is not None
    print(f"reconcile_http_transfer_cpu_share_{last[0]}: {100 * last[1]['cpu_share']:.1f} %")


if __name__ == "__main__":
    main()
