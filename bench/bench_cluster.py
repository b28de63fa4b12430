"""Ingest on SQLite against Redis with 1 and 2 nodes, side by side in one run (issue 15).

Each configuration gets a fresh log preloaded with ``--preload`` records of the
query bench's corpus, then ``bench_ingest``'s load generator (its signed
envelopes, its lean HTTP/1.1 client over TLS, 32 connections) submits
``--events`` distinct envelopes; with 2 nodes the connections are spread evenly
over both ``akrelay serve`` processes, which share one durable ``redis-server``
(AOF on, ``appendfsync always``; started here unless ``--redis URL`` names one,
whose databases 1-9 are flushed). Configurations:

* ``sqlite-1``: one node, the embedded SQLite log (the baseline);
* ``redis-1``: one node on Redis;
* ``redis-1-nolimit``: the same with rate limits off (what the shared limiter costs);
* ``redis-2``: two nodes on one Redis;
* ``redis-2x1``: two nodes of one worker each (as many workers as one node of two);
* any of them with ``-core``: ``--core-only`` nodes (no search index or KIP nexus following the log),
  so the difference is what each node's followers cost.

CPU per event is reported for the relays (every process of each node), the Redis
server (``INFO cpu``) and the load generator: on a shared machine it is the
figure load does not inflate, and their sum gives the CPU-bound capacity of 2 idle cores.
The relays' share is split by process: the HTTP workers (which also run the
node-local text indexer), the followers' process (search indexer, KIP importer)
and the launcher. ``--profile DIR`` records each node during the timed phase with
``py-spy record --nonblocking -f raw --subprocesses`` (folded stacks, one file per
node and round) to compare where the time goes per accepted event.

Rate limits are on (except in ``-nolimit``) with a rate no single-IP load
generator reaches, so every request takes its token (with Redis: one script call
in Redis per request) and none is refused: the realistic path without throttling
the bench. Redis memory per accepted event (``INFO memory`` ``used_memory``
delta) and AOF bytes per event are read around each Redis run.

The whole set runs ``--rounds`` times, interleaved, and the medians are reported
with the spread (min-max), since the machine's 2 cores are shared.

Usage: python bench/bench_cluster.py [--events 10000] [--rounds 3] [--workers 2] [--configs sqlite-1,redis-1,redis-2]
Last line: ``cluster_ingest_2_nodes: <n> accepted/s`` (median over rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import bench_ingest  # noqa: E402
from bench_ingest import _client, group_process_cpu, presign, run, start, stop, wait_idle  # noqa: E402

#: Rate limits on, never reached by the load generator: each request still takes its token.
LIMITS_ON = ("--write-rate", "1000000", "--write-burst", "1000000", "--read-rate", "1000000",
             "--read-burst", "1000000")
LIMITS_OFF = ("--write-rate", "0", "--read-rate", "0")
CONFIGS = {  # name: (backend, nodes, rate-limit arguments, workers per node: 0 = --workers)
    "sqlite-1": ("sqlite", 1, LIMITS_ON, 0),
    "redis-1": ("redis", 1, LIMITS_ON, 0),
    "redis-1-nolimit": ("redis", 1, LIMITS_OFF, 0),
    "redis-2": ("redis", 2, LIMITS_ON, 0),
    "redis-2x1": ("redis", 2, LIMITS_ON, 1),
}
#: ``<name>-core``: the same with ``--core-only`` (no search index or KIP nexus following the log on each node)
CONFIGS.update({f"{name}-core": spec for name, spec in list(CONFIGS.items())})


ROLES = ("workers", "followers", "launcher")


def role_cpu_seconds(pgid: int) -> dict[str, float]:
    """:func:`bench_ingest.group_cpu_seconds` split by process: HTTP workers, the followers' process, the launcher."""
    out = dict.fromkeys(ROLES, 0.0)
    for pid, seconds in group_process_cpu(pgid).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        role = "launcher" if pid == pgid else "followers" if b"akrelay.process.followers" in cmdline else "workers"
        out[role] += seconds
    return out


def start_profiles(pids: list[int], directory: Path, label: str) -> list[subprocess.Popen]:
    """``py-spy record`` on every process of each node (raw folded stacks), until :func:`stop_profiles`."""
    directory.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(["py-spy", "record", "--nonblocking", "-f", "raw", "--subprocesses", "-r", "50",
                              "-p", str(pid), "-o", str(directory / f"{label}-node{k}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for k, pid in enumerate(pids)]


def stop_profiles(profilers: list[subprocess.Popen]) -> None:
    for proc in profilers:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for proc in profilers:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def redis_cpu(client: Any) -> float:
    """CPU seconds the Redis server has used (``INFO cpu``, user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def aof_bytes(client: Any) -> int:
    """Bytes of the append-only file(s) on disk (Redis 7: a directory of base + incremental files)."""
    directory = Path(client.config_get("dir")["dir"])
    name = client.config_get("appenddirname").get("appenddirname", "appendonlydir")
    aof = directory / name
    if aof.is_dir():
        return sum(p.stat().st_size for p in aof.iterdir())
    single = directory / client.config_get("appendfilename")["appendfilename"]
    return single.stat().st_size if single.exists() else 0


def one(name: str, base: Path, url: str, db: int, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Run configuration ``name`` on a fresh log; return its figures."""
    backend, nodes, limits, workers = CONFIGS[name]
    root = base / f"{name}-{seed}"
    datas = [root / f"node{k}" / "data" for k in range(nodes)]
    for d in datas:
        d.mkdir(parents=True)
    client = None
    if backend == "redis":
        import redis

        store_url = f"{url.rsplit('/', 1)[0]}/{db}"
        client = redis.Redis.from_url(store_url)
        client.flushdb()
        bench_ingest.STORE = store_url
    else:
        bench_ingest.STORE = ""
    try:
        bench_ingest.preload(datas[0], args.preload, 0)
        items = presign(args.events + 500, seed=seed)
        procs = []
        try:
            for d in datas:
                serve_args = limits + (("--follow-max-defer", str(args.follow_max_defer)) if args.follow_max_defer else ())
                procs.append(start(d, workers or args.workers, args.core_only or name.endswith("-core"), serve_args))
            for proc, _ in procs:
                wait_idle(proc.pid, args.catch_up_timeout)
            ports = [port for _, port in procs]
            run(spread_certs(ports, datas, items[:500], args.clients))  # warm-up
            used0 = int(client.info("memory")["used_memory"]) if client else 0
            aof0 = aof_bytes(client) if client else 0
            roles0 = [role_cpu_seconds(proc.pid) for proc, _ in procs]
            redis0 = redis_cpu(client) if client else 0.0
            profilers = (start_profiles([proc.pid for proc, _ in procs], Path(args.profile), f"{name}-{seed}")
                         if args.profile else [])
            gen0 = time.process_time()
            try:
                elapsed, counts = run(spread_certs(ports, datas, items[500:], args.clients))
            finally:
                stop_profiles(profilers)
            gen = time.process_time() - gen0
            roles = {role: sum(role_cpu_seconds(proc.pid)[role] - before[role]
                               for (proc, _), before in zip(procs, roles0)) for role in ROLES}
            cpu = sum(roles.values())
            rcpu = redis_cpu(client) - redis0 if client else 0.0
            used = int(client.info("memory")["used_memory"]) - used0 if client else 0
            aof = aof_bytes(client) - aof0 if client else 0
        finally:
            for proc, _ in procs:
                stop(proc)
    finally:
        if client is not None:
            client.flushdb()
            client.close()
    if counts["failed"]:
        raise SystemExit(f"{name}: {counts['failed']} submissions failed")
    ok = counts["ok"]
    out = {"rate": ok / elapsed, "relay_cpu_ms": cpu / ok * 1e3, "gen_cpu_ms": gen / ok * 1e3,
           "redis_cpu_ms": rcpu / ok * 1e3}
    out.update({f"{role}_cpu_ms": roles[role] / ok * 1e3 for role in ROLES})
    if client is not None:
        out.update(mem=used / ok, aof=aof / ok)
    extra = (f", Redis CPU {out['redis_cpu_ms']:.3f} ms/event, +{out['mem']:.0f} B/event in memory, "
             f"+{out['aof']:.0f} B/event AOF") if client else ""
    total = out["relay_cpu_ms"] + out["gen_cpu_ms"] + out["redis_cpu_ms"]
    split = ", ".join(f"{role} {out[role + '_cpu_ms']:.3f}" for role in ROLES)
    print(f"  {name:<16} {ok} accepted in {elapsed:.2f} s = {out['rate']:,.0f} accepted/s "
          f"(relay CPU {out['relay_cpu_ms']:.3f} ms/event: "
          f"{split}{extra}, load generator {out['gen_cpu_ms']:.3f} ms/event; "
          f"CPU-bound capacity of {os.cpu_count()} idle cores ~ {(os.cpu_count() or 1) / total * 1e3:,.0f}/s; "
          f"load {os.getloadavg()[0]:.1f})", flush=True)
    return out


async def spread_certs(ports: list[int], datas: list[Path], items: list[bytes], clients: int) -> tuple[float, dict[str, int]]:
    """``bench_ingest.ingest`` over several nodes: connections round-robin over ``ports`` (each node's own
    self-signed certificate trusted), one shared queue."""
    contexts = [ssl.create_default_context(cafile=str(d / "tls-cert.pem")) for d in datas]
    queue = list(reversed(items))
    counts = {"ok": 0, "failed": 0}
    started = time.perf_counter()
    await asyncio.gather(*(_client(ports[k % len(ports)], contexts[k % len(ports)], queue, counts)
                           for k in range(clients)))
    return time.perf_counter() - started, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="sqlite-1,redis-1,redis-1-nolimit,redis-2x1,redis-2")
    parser.add_argument("--preload", type=int, default=10_000, help="records in each log before timing")
    parser.add_argument("--events", type=int, default=10_000, help="timed submissions per configuration")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="worker processes per node")
    parser.add_argument("--core-only", action="store_true", help="serve without search/KIP/federation")
    parser.add_argument("--catch-up-timeout", type=float, default=600.0)
    parser.add_argument("--follow-max-defer", type=float, default=None, metavar="SECONDS",
                        help="serve every node with this --follow-max-defer (default: the relay's own default)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="py-spy record each node during the timed phase into DIR (raw folded stacks)")
    parser.add_argument("--redis", default=None, help="use this Redis (its databases 1-9 are FLUSHED)")
    args = parser.parse_args(argv)
    names = [c for c in args.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            raise SystemExit(f"unknown configuration {c!r}; choose from {', '.join(CONFIGS)}")
    print(f"bench_cluster: {os.cpu_count()} CPUs, {args.workers} workers per node, {args.clients} clients, "
          f"{args.preload} preloaded, {args.events} timed events per configuration, {args.rounds} rounds", flush=True)
    figures: dict[str, list[dict[str, float]]] = {c: [] for c in names}
    from redis_server import redis_url_or_server

    with tempfile.TemporaryDirectory(prefix="akrelay-bench-cluster-") as tmp, \
            redis_url_or_server(args.redis, Path(tmp) / "redis") as url:
        for r in range(args.rounds):
            print(f"round {r + 1}", flush=True)
            for k, c in enumerate(names):
                figures[c].append(one(c, Path(tmp), url, k + 1, args, seed=(int(time.time()) + 17 * r + k) % 200))
    print("medians over rounds (min-max):")
    for c in names:
        rates = [f["rate"] for f in figures[c]]
        line = f"  {c:<16} {statistics.median(rates):7,.0f} accepted/s ({min(rates):,.0f}-{max(rates):,.0f})"
        line += f", relay CPU {statistics.median(f['relay_cpu_ms'] for f in figures[c]):.3f} ms/event ("
        line += ", ".join(f"{role} {statistics.median(f[role + '_cpu_ms'] for f in figures[c]):.3f}"
                          for role in ROLES) + ")"
        if "mem" in figures[c][0]:
            line += f", Redis CPU {statistics.median(f['redis_cpu_ms'] for f in figures[c]):.3f} ms/event"
        if "mem" in figures[c][0]:
            line += (f", Redis {statistics.median(f['mem'] for f in figures[c]):.0f} B/event in memory, "
                     f"{statistics.median(f['aof'] for f in figures[c]):.0f} B/event AOF")
        print(line)
    base = figures.get("sqlite-1")
    for c in names:
        if base and c != "sqlite-1":
            ratio = statistics.median(f["rate"] for f in figures[c]) / statistics.median(f["rate"] for f in base)
            print(f"  {c} / sqlite-1: {ratio:.2f} x")
    if "redis-1" in figures and "redis-1-nolimit" in figures:
        on = statistics.median(f["relay_cpu_ms"] for f in figures["redis-1"])
        off = statistics.median(f["relay_cpu_ms"] for f in figures["redis-1-nolimit"])
        print(f"  shared rate limiter: {on - off:+.3f} ms relay CPU per event")
    last = "redis-2" if "redis-2" in figures else names[-1]
    nodes = CONFIGS[last][1]
    print(f"cluster_ingest_{nodes}_node{'s' if nodes > 1 else ''}: "
          f"{statistics.median(f['rate'] for f in figures[last]):.0f} accepted/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
