"""How fast a restarted relay answers, measured as a user would (issue 25, "A fast restart").

One run:

1. builds (or reuses, ``--data``) a data directory with ``--records`` synthetic records
   (``bench_kql``'s generator: publishes and assessments by 500 actors, canonical event
   bytes under placeholder signatures, committed in bulk: seconds, not the minutes a
   signed corpus takes; a store never re-verifies what it accepted);
2. starts ``akrelay serve --workers 2`` on it once, until every follower (search index,
   KIP nexus, trigram index) has caught up and is idle, then stops it: what a relay that
   has been running looks like on disk;
3. restarts it ``--restarts`` times and records, from the spawn of the command to the
   answer: the first answered ``GET /.well-known/agent-knowledge``, the first ``200`` of
   ``GET /readyz``, and the first ``POST /v1/kip`` KQL lookup that returns the last
   accepted capsule (and the CPU seconds the relay's processes had used by then, a figure
   the machine's load does not inflate); then the SIGTERM-to-exit time;
4. times a cold ``akrelay --help`` (a fresh interpreter each time), wall and CPU.

Before anything runs, each interpreter's ``akrelay`` package is byte-compiled
(``compileall``), as ``pip install`` does for an installed package: an editable checkout
under ``PYTHONDONTWRITEBYTECODE=1`` (as on the project machine) would otherwise compile
every akrelay module from source in every process of every start, about 0.4 s of CPU
per worker that no installed relay pays. ``--no-compile`` measures without it.

Each ``--python`` is a separate interpreter whose ``akrelay`` is measured in turn on the
same data directory (e.g. this worktree's venv and one with an older checkout), so a
before/after comparison shares the machine's load. Medians are quoted.

Last line: ``restart_first_kql: <value> s`` (the median, first interpreter).

    python3 bench/bench_restart.py [--records N] [--data DIR] [--restarts N] [--python PY ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

ORIGIN = "https://localhost:8443"
LOOKUP = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", key: :capsule} }'


def build(data: Path, records: int, python: str) -> None:
    """Fill ``data`` with about ``records`` records, in a child of ``python`` (its akrelay commits them)."""
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / 'bench')!r})
from bench_kql import build
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.store.sqlite import SqliteStore
log, _, _ = build(int({records} / 1.5))
store = SqliteStore({str(data / 'relay.sqlite3')!r})
have = store.checkpoint()
for lo in range(have, len(log), 5000):
    store.commit_many([(Envelope(r.envelope.id, r.envelope.event, r.envelope.signature,
                                 canonicalize(r.envelope.event)), r.accepted_at) for r in log[lo:lo + 5000]])
print(store.checkpoint())
store.close()
"""
    subprocess.run([python, "-c", code], check=True)


def last_capsule(data: Path, python: str) -> tuple[str, str]:
    """The last accepted publish: its capsule ID and title."""
    code = f"""
import json
from akrelay.store.sqlite import SqliteStore
store = SqliteStore({str(data / 'relay.sqlite3')!r})
seq = store.checkpoint()
while True:
    (record,) = store.iter_records(seq - 1, 1)
    if record.envelope.type == "knowledge.publish":
        print(json.dumps([record.envelope.id, record.envelope.payload["title"]]))
        break
    seq -= 1
store.close()
"""
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout
    capsule, title = json.loads(out.strip().splitlines()[-1])
    return capsule, title


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command_of(python: str) -> str:
    """The ``akrelay`` console script beside ``python`` (what a user types)."""
    script = Path(python).parent / "akrelay"
    if not script.exists():
        raise SystemExit(f"no akrelay command beside {python}")
    return str(script)


def spawn(python: str, data: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, float]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    spawned = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen([command_of(python), "serve", "--data", str(data), "--port", str(port),
                                 "--origin", ORIGIN, "--workers", "2", "--write-rate", "0", "--read-rate", "0"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, port, spawned


def stop(proc: subprocess.Popen[bytes]) -> float:
    t = time.monotonic()
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return time.monotonic() - t


def measure(python: str, data: Path, capsule: str, title: str, timeout: float, log: Path,
            keep: Callable[[subprocess.Popen[bytes]], object] | None = None) -> dict[str, float]:
    """Spawn, then poll (every 20 ms) until discovery, /readyz and the KQL lookup have each answered.

    ``keep``: called with the running relay before it is stopped (the warm-up waits there).
    """
    import httpx
    from bench_ingest import group_cpu_seconds

    proc, port, spawned = spawn(python, data, log)
    base = f"https://localhost:{port}"
    body = {"kip": "2.0", "operations": [{"command": LOOKUP, "parameters": {"capsule": capsule}}]}
    seen: dict[str, float] = {}
    client = None
    try:
        while len(seen) < 3:
            if time.monotonic() > spawned + timeout or proc.poll() is not None:
                raise SystemExit(f"akrelay serve never answered everything ({seen}): see {log}")
            try:
                if client is None:
                    if not (data / "tls-cert.pem").exists():
                        time.sleep(0.02)
                        continue
                    client = httpx.Client(verify=ssl.create_default_context(cafile=str(data / "tls-cert.pem")),
                                          timeout=30)
                if "first_get" not in seen:
                    client.get(f"{base}/.well-known/agent-knowledge").raise_for_status()
                    seen["first_get"] = time.monotonic() - spawned
                if "readyz" not in seen and client.get(f"{base}/readyz").status_code == 200:
                    seen["readyz"] = time.monotonic() - spawned
                if "kql" not in seen:
                    result = client.post(f"{base}/v1/kip", json=body).json()["results"][0]
                    if result.get("status") == "succeeded" and result["result"]["rows"] == [[title]]:
                        seen["kql"] = time.monotonic() - spawned
                        # the CPU the relay's processes used until then: what load does not inflate
                        seen["kql_cpu"] = group_cpu_seconds(proc.pid)
            except (httpx.HTTPError, OSError, KeyError, IndexError, ValueError):
                pass
            if len(seen) < 3:
                time.sleep(0.02)
        if keep is not None:
            keep(proc)
    finally:
        if client is not None:
            client.close()
        seen["stop"] = stop(proc)
    return seen


def warm_up(python: str, data: Path, capsule: str, title: str, timeout: float, log: Path) -> float:
    """First start on the data directory: until the nexus has the last capsule and every follower is idle.

    Idleness alone is not enough on a loaded machine: the followers run at idle priority and
    may look idle while starved, so the last capsule must be readable first.
    """
    from bench_ingest import wait_idle

    t = time.monotonic()
    measure(python, data, capsule, title, timeout, log, keep=lambda proc: wait_idle(proc.pid, timeout))
    return time.monotonic() - t


def cold_help(python: str, runs: int) -> tuple[float, float]:
    """The median wall time and CPU time (user + system) of ``akrelay --help`` in a fresh process."""
    import resource

    times, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run([command_of(python), "--help"], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times), statistics.median(cpus)


def byte_compile(python: str) -> None:
    """Byte-compile ``python``'s akrelay package in place, as an install does (``__pycache__``)."""
    code = "import akrelay, compileall, os; compileall.compile_dir(os.path.dirname(akrelay.__file__), quiet=1)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([python, "-c", code], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--data", type=Path, help="a data directory to (re)use")
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--help-runs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120, help="longest wait for one restart to answer")
    parser.add_argument("--catch-up-timeout", type=float, default=3600)
    parser.add_argument("--python", action="append", help="an interpreter whose akrelay to measure (repeatable)")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not byte-compile the akrelay packages first (see the module's docstring)")
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    if not args.no_compile:
        for python in pythons:
            byte_compile(python)
    data = args.data or Path(tempfile.mkdtemp(prefix="bench-restart-")) / "data"
    data.mkdir(parents=True, exist_ok=True)
    log = data.parent / "bench-restart-serve.log"
    build(data, args.records, pythons[0])
    capsule, title = last_capsule(data, pythons[0])
    print(f"bench_restart: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, data {data}", flush=True)
    caught_up = warm_up(pythons[0], data, capsule, title, args.catch_up_timeout, log)
    print(f"first start caught up and idle after {caught_up:.0f} s", flush=True)
    figures: dict[str, dict[str, list[float]]] = {p: {} for p in pythons}
    helps = {p: cold_help(p, args.help_runs) for p in pythons}
    for _ in range(args.restarts):  # interleaved: A B A B, so both see the same load
        for python in pythons:
            for name, value in measure(python, data, capsule, title, args.timeout, log).items():
                figures[python].setdefault(name, []).append(value)
    for python in pythons:
        f = figures[python]
        print(f"{python}: spawn to first GET {statistics.median(f['first_get']):.2f} s, to /readyz 200 "
              f"{statistics.median(f['readyz']):.2f} s, to KQL of the last capsule {statistics.median(f['kql']):.2f} s "
              f"(max {max(f['kql']):.2f} s over {len(f['kql'])}; CPU of the relay's processes until then "
              f"{statistics.median(f['kql_cpu']):.2f} s); SIGTERM to exit {statistics.median(f['stop']):.2f} s; "
              f"cold --help {helps[python][0]:.3f} s wall, {helps[python][1]:.3f} s CPU; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"restart_first_kql: {statistics.median(figures[pythons[0]]['kql']):.2f} s")


if __name__ == "__main__":
    main()
