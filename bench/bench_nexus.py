"""The KIP nexus on disk against the in-memory nexus, on the same data (issue 13).

One run:

1. preloads a relay data directory with N realistic records (``bench_query``'s
   corpus, with 500 actors: about 85 % publish, 12 % assess, 3 % retract; the
   default 118,000 records hold about 100k capsules and 14k assessments), unless
   ``--data`` names one that already has them;
2. imports the log into the on-disk nexus the way the one importer does (batches
   of ``DISK_BATCH`` records per SQLite transaction): events/s per CPU second and
   per wall second, file size and bytes per event;
3. for each backend, starts a fresh reader process (what a restarted worker is)
   that opens the KIP runtime on the data directory, answers a KQL lookup of the
   last accepted capsule (restart-to-answer, from process spawn), runs the
   ``bench_kql`` queries and lookups by key, name, type, predicate and author
   (CPU p50/p99 per query, one read snapshot per query), reports its private memory
   (``RssAnon``) and how long a graceful stop of the KIP runtime takes. The
   in-memory reader has to import the whole log itself (there is no snapshot);
4. with ``--serve``: ``akrelay serve --workers 2`` on the data directory, started
   once until every follower (search, KIP) is idle and stopped, then restarted: time
   from spawn to a ``POST /v1/kip`` answer naming the last capsule, ``RssAnon`` of each
   worker after a few queries, and the time a SIGTERM takes to stop it all.

Last line: ``nexus_reader_rss_anon: <value> MB`` (the on-disk reader), or with ``--serve``
``nexus_serve_worker_rss_anon: <value> MB`` (the larger of the two ``serve`` workers).

    python3 bench/bench_nexus.py [--records N] [--samples N] [--data DIR] [--serve] [--build-only]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

ORIGIN = "https://localhost:8443"
ACTORS = 500

LOOKUPS = {
    "by_key": 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", key: :capsule} }',
    "by_name": 'FIND(?c.key, ?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: :name} }',
    "by_type": 'FIND(?a.key) WHERE { ?a {type: "Agent"} } LIMIT 20',
    "by_predicate": 'FIND(?p) WHERE { ?p (?s, "ak_contradicts", ?o) } LIMIT 10',
    "by_author": ('FIND(?x.stance) WHERE { ?g {type: "Agent", key: :actor} ?x ASSERTION {asserted_by: ?g} } '
                  "LIMIT 10"),
}


def rss_anon_kb(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def sample_params(store, rng: random.Random, count: int) -> list[dict]:
    """Parameters drawn from accepted publish events: capsule, its title and actor, a tag, title words."""
    head = store.checkpoint()
    out: list[dict] = []
    while len(out) < count:
        (record,) = store.iter_records(rng.randrange(head), 1)
        env = record.envelope
        if env.type != "knowledge.publish":
            continue
        payload = env.payload
        words = payload["title"].split()
        out.append({"capsule": env.id, "name": payload["title"], "actor": env.actor,
                    "tag": rng.choice(payload.get("tags") or ["tag0"]), "q": " ".join(rng.sample(words, 2))})
    return out


def last_publish(store):
    """The last accepted publish record: its capsule is what a restarted relay must answer with."""
    seq = store.checkpoint()
    while True:
        (record,) = store.iter_records(seq - 1, 1)
        if record.envelope.type == "knowledge.publish":
            return record
        seq -= 1


# ------------------------------------------------------------------------ child


def child(backend: str, data: Path, spawned_at: float, samples: int) -> None:
    from bench_kql import QUERIES

    from akrelay.kip.kql.evaluate import execute_kql
    from akrelay.kip.wiring import open_runtime
    from akrelay.store.sqlite import SqliteStore

    store = SqliteStore(data / "relay.sqlite3")
    last = last_publish(store)
    seq = last.seq
    c0 = time.process_time()
    rt, follower = open_runtime(store, data, origin=ORIGIN, follow=False, backend=backend)
    open_cpu = time.process_time() - c0
    with rt.lock:
        rows = execute_kql(rt, LOOKUPS["by_key"], {"capsule": last.envelope.id}, rt.nexus.head)[0]["rows"]
    answered = time.time() - spawned_at
    assert rows == [[last.envelope.payload["title"]]], rows
    rng = random.Random(5)
    params = sample_params(store, rng, 200)
    figures: dict[str, dict[str, float]] = {}
    for name, command in {**QUERIES, **LOOKUPS}.items():
        cpu: list[float] = []
        rows_seen = 0
        for i in range(samples):
            p = params[i % len(params)]
            c = time.thread_time()
            with rt.lock:
                result, _ = execute_kql(rt, command, p, rt.nexus.head)
            cpu.append((time.thread_time() - c) * 1000)
            rows_seen += len(result["rows"])
        figures[name] = {"p50": statistics.median(cpu), "p99": percentile(cpu, 0.99),
                         "rows": rows_seen / samples}
    rss = rss_anon_kb()
    t = time.perf_counter()
    follower.stop()
    store.close()
    stopped = time.perf_counter() - t
    print(json.dumps({"backend": backend, "answer_s": answered, "open_cpu_s": open_cpu, "head": rt.nexus.head
                      if backend == "memory" else seq, "rss_anon_mb": rss / 1024, "stop_s": stopped,
                      "kql": figures}), flush=True)


def run_child(backend: str, data: Path, samples: int) -> dict:
    spawned = time.time()
    out = subprocess.run([sys.executable, __file__, "--child", backend, "--data", str(data), "--spawned",
                          repr(spawned), "--samples", str(samples)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the {backend} reader failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ serve


def serve_figures(data: Path, backend: str, samples: int, timeout: float) -> dict:
    """First start (every follower catches up, then idle), graceful stop, and the measured restart:
    time to a KIP answer naming the last capsule, every bench_kql query and lookup over HTTPS
    (``samples`` each, spread over both workers), then each worker's ``RssAnon`` and the stop."""
    from bench_ingest import wait_idle
    from bench_kql import QUERIES

    from akrelay.store.sqlite import SqliteStore

    store = SqliteStore(data / "relay.sqlite3")
    last = last_publish(store)
    params = sample_params(store, random.Random(9), 50)
    store.close()
    proc, port, _ = _serve(data, backend, last.envelope.id, timeout)
    waited = wait_idle(proc.pid, timeout)
    first_stop = _stop(proc)
    STARTUP.clear()
    proc, port, answer_s = _serve(data, backend, last.envelope.id, timeout)
    first_http = STARTUP.get("first_http", float("nan"))
    latency: dict[str, tuple[float, float]] = {}
    try:
        client = _client(data)
        for name, command in {**QUERIES, **LOOKUPS}.items():
            wall: list[float] = []
            for i in range(samples):
                t = time.perf_counter()
                answer = client.post(f"https://localhost:{port}/v1/kip", json={"kip": "2.0", "operations": [
                    {"command": command, "parameters": params[i % len(params)]}]}).json()
                wall.append((time.perf_counter() - t) * 1000)
                if answer["results"][0].get("status") != "succeeded":
                    raise SystemExit(f"{name} failed over HTTPS: {answer}")
            latency[name] = (statistics.median(wall), percentile(wall, 0.99))
        client.close()
        workers = [pid for pid in _group(proc.pid) if pid != proc.pid]
        rss = sorted(rss_anon_kb(pid) / 1024 for pid in workers)
    finally:
        stop_s = _stop(proc)
    return {"backend": backend, "answer_s": answer_s, "worker_rss_anon_mb": rss, "stop_s": stop_s,
            "first_stop_s": first_stop, "first_http_s": first_http, "catch_up_s": waited, "http_ms": latency}


def _client(data: Path):
    import httpx

    return httpx.Client(verify=ssl.create_default_context(cafile=str(data / "tls-cert.pem")), timeout=60)


STARTUP: dict[str, float] = {}


def _serve(data: Path, backend: str, capsule: str, timeout: float) -> tuple[subprocess.Popen, int, float]:
    """``akrelay serve --workers 2``, and the seconds from spawn to a KIP answer naming ``capsule``."""
    import httpx
    from bench_ingest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    env["AKRELAY_KIP_NEXUS"] = backend
    log = open(data.parent / f"serve-nexus-{backend}.log", "ab")
    spawned = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "akrelay", "serve", "--data", str(data), "--port", str(port),
                             "--origin", ORIGIN, "--workers", "2", "--write-rate", "0",
                             "--read-rate", "0"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    body = {"kip": "2.0", "operations": [{"command": LOOKUPS["by_key"], "parameters": {"capsule": capsule}}]}
    client = None
    while time.monotonic() < spawned + timeout and proc.poll() is None:
        try:
            if client is None and (data / "tls-cert.pem").exists():
                client = _client(data)
            if client is not None:
                if "first_http" not in STARTUP:
                    client.get(f"https://localhost:{port}/.well-known/agent-knowledge").raise_for_status()
                    STARTUP["first_http"] = time.monotonic() - spawned
                result = client.post(f"https://localhost:{port}/v1/kip", json=body).json()["results"][0]
                if result.get("status") == "succeeded" and result["result"]["rows"]:
                    client.close()
                    return proc, port, time.monotonic() - spawned
        except (httpx.HTTPError, OSError, KeyError, IndexError, ValueError):
            pass
        time.sleep(0.1)
    _stop(proc)
    raise SystemExit(f"akrelay serve ({backend}) never answered: see {log.name}")


def _stop(proc: subprocess.Popen) -> float:
    t = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        alive = [pid for pid in _group(proc.pid) if pid != proc.pid]
        print(f"  akrelay serve did not exit within 60 s of SIGTERM (still running: {alive}); SIGKILL", flush=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return time.monotonic() - t


def _group(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                out.append(int(entry))
    return out


# ------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=118_000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--data", type=Path, help="a data directory to (re)use")
    parser.add_argument("--serve", action="store_true", help="also measure akrelay serve --workers 2")
    parser.add_argument("--serve-timeout", type=float, default=2400,
                        help="longest wait for serve's first start to catch up (search indexes every record)")
    parser.add_argument("--serve-samples", type=int, default=40, help="HTTPS samples per query on the restarted serve")
    parser.add_argument("--serve-memory", action="store_true", help="with --serve: the in-memory design too")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the in-memory reader (at 1M it needs ~13 GB and minutes of import)")
    parser.add_argument("--build-only", action="store_true",
                        help="only build the relay log in --data (the slow part at 1M), then stop")
    parser.add_argument("--child", choices=("memory", "sqlite"), help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.data, args.spawned, args.samples)
        return

    from bench_query import Corpus, build

    from akrelay.kip.config import KipConfig
    from akrelay.kip.follower import follow
    from akrelay.kip.nexus_sqlite import nexus_path, open_writer
    from akrelay.protocol.signer import Signer
    from akrelay.store.sqlite import SqliteStore

    data = args.data or Path(tempfile.mkdtemp(prefix="bench-nexus-")) / "data"
    data.mkdir(parents=True, exist_ok=True)
    store_path = data / "relay.sqlite3"
    existing = SqliteStore(store_path)
    have = existing.checkpoint()
    existing.close()
    print(f"bench_nexus: {os.cpu_count()} CPUs, data {data}, {args.records} records wanted, {have} present",
          flush=True)
    if have < args.records:
        corpus = Corpus(seed=7)
        # 500 actors, as in bench_kql (the corpus default of 20 would give each actor 5k capsules)
        corpus.signers = [Signer.from_seed(i.to_bytes(4, "big") * 8) for i in range(1, ACTORS + 1)]
        for _ in range(have):
            corpus.rng.random()
        build(store_path, args.records, corpus, have).close()
    if args.build_only:
        return
    store = SqliteStore(store_path)
    events = store.checkpoint()
    space = KipConfig.load(data, origin=ORIGIN).space_id
    path = nexus_path(data)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    writer = open_writer(path, space)
    w0, c0 = time.perf_counter(), time.process_time()
    follow(store, writer)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    counts = writer.counts()
    writer.close()
    store.close()
    size = path.stat().st_size
    print(f"import into the on-disk nexus: {events} events in {wall:.1f} s wall, {cpu:.1f} s CPU: "
          f"{events / cpu:,.0f} events/s per CPU second, {events / wall:,.0f}/s wall; "
          f"{counts['concept']:,} concepts, {sum(counts.values()):,} elements; file {size / 1e6:.0f} MB "
          f"({size / events:,.0f} bytes per event)", flush=True)

    results = {b: run_child(b, data, args.samples) for b in (("sqlite",) if args.no_memory else ("sqlite", "memory"))}
    disk = results["sqlite"]
    memory = results.get("memory") or {**disk, "backend": "memory (skipped)", "rss_anon_mb": float("nan"),
                                       "kql": {k: {"p50": float("nan"), "p99": float("nan")} for k in disk["kql"]}}
    for r in results.values():
        print(f"{r['backend']} reader: answer {r['answer_s']:.2f} s after spawn (open CPU {r['open_cpu_s']:.1f} s), "
              f"RssAnon {r['rss_anon_mb']:.0f} MB, graceful stop {r['stop_s'] * 1000:.0f} ms", flush=True)
    print(f"{'query':<22}{'sqlite p50/p99 ms':>22}{'memory p50/p99 ms':>22}{'rows':>8}")
    for name in disk["kql"]:
        d, m = disk["kql"][name], memory["kql"][name]
        print(f"{name:<22}{d['p50']:>10.2f} / {d['p99']:>7.2f}{m['p50']:>12.2f} / {m['p99']:>7.2f}{d['rows']:>8.1f}")
    print(f"memory ratio (on disk / in memory): {disk['rss_anon_mb'] / memory['rss_anon_mb']:.2f}; "
          f"memory per event: in memory {memory['rss_anon_mb'] * 1024 / events:.1f} KB, on disk "
          f"{disk['rss_anon_mb'] * 1024 / events:.2f} KB (private), {size / events / 1024:.1f} KB file")

    served: list[dict] = []
    if args.serve:
        for backend in ("sqlite", "memory") if args.serve_memory else ("sqlite",):
            s = serve_figures(data, backend, args.serve_samples, args.serve_timeout)
            served.append(s)
            print(f"akrelay serve --workers 2 ({backend} nexus, {events:,} records): first start caught up in "
                  f"{s['catch_up_s']:.0f} s, stopped in {s['first_stop_s']:.1f} s; restart: KIP answer with the "
                  f"last capsule {s['answer_s']:.1f} s after spawn (first HTTP answer of any kind: "
                  f"{s['first_http_s']:.1f} s); worker RssAnon "
                  f"{', '.join(f'{x:.0f}' for x in s['worker_rss_anon_mb'])} MB after "
                  f"{args.serve_samples * len(s['http_ms'])} KIP requests; SIGTERM to exit {s['stop_s']:.1f} s",
                  flush=True)
            for name, (p50, p99) in s["http_ms"].items():
                print(f"  over HTTPS ({backend}): {name:<22} wall p50 {p50:7.2f} ms, p99 {p99:7.2f} ms", flush=True)
    print(f"kip_import_disk: {events / cpu:.0f} events/s")
    print(f"nexus_reader_rss_anon: {disk['rss_anon_mb']:.0f} MB")
    if served:
        print(f"nexus_serve_worker_rss_anon: {max(served[0]['worker_rss_anon_mb']):.0f} MB")


if __name__ == "__main__":
    main()
