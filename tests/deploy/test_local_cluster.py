"""``deploy/local-cluster`` runs a deployment: two nodes on one Redis log, and stops without leftovers.

The script is run as a person runs it (in the foreground, stopped with SIGTERM like Ctrl-C), on free
loopback ports in a temporary directory. An event accepted by node 1 is read back from node 2 with
the same ``seq``, and an exact resubmission to node 2 returns that same record. Afterwards no
process that the cluster started is left.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from redis_server import free_port, require_redis_server

from akrelay.protocol.signer import Signer, publish_event

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local-cluster"
LICENSE = "https://creativecommons.org/licenses/by/4.0/"
READY_WITHIN = 60.0  # the script's own bound for Redis and both nodes


def distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def signed_capsule() -> bytes:
    signer = Signer.from_seed(bytes([41]) * 32)
    payload = {"license": LICENSE, "kind": "observation", "title": "Two nodes, one log",
               "statement": "An event accepted by one node is served by the other.", "language": "en",
               "context": {"scope": "local-cluster test", "conditions": [], "limitations": []},
               "basis": "Submitted by tests/deploy/test_local_cluster.py."}
    now = time.time_ns() // 1_000_000
    return json.dumps(signer.sign(publish_event(signer.agent_id, now - 1000, 1, payload))).encode()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until_ready(process: subprocess.Popen, state_path: Path, started: dict[int, str]) -> dict:
    """The cluster's state once it says it is ready; every pid it names is noted in ``started`` on the way."""
    deadline = time.monotonic() + READY_WITHIN + 30
    while time.monotonic() < deadline:
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError):
            state = {}
        for name, entry in [("redis", state.get("redis")), *[(f"node {i}", n) for i, n in enumerate(state.get("nodes", []), 1)]]:
            if entry:
                started[entry["pid"]] = name
        if state.get("ready"):
            return state
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError("local-cluster did not become ready")


def test_two_nodes_serve_one_log_and_stop_cleanly(tmp_path) -> None:
    require_redis_server()
    redis_port, port1, port2 = distinct_free_ports(3)
    directory = tmp_path / "cluster"
    log = tmp_path / "local-cluster.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    started: dict[int, str] = {}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "up", "--dir", str(directory), "--redis-port", str(redis_port),
             "--ports", f"{port1},{port2}", "--timeout", str(READY_WITHIN)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        try:
            state = wait_until_ready(process, directory / "cluster.json", started)
        except AssertionError:
            pytest.fail(f"local-cluster did not become ready (exit {process.poll()}):\n{log.read_text(errors='replace')}")
        node1, node2 = state["nodes"]
        assert state["store"] == f"redis://127.0.0.1:{redis_port}/0"
        assert (node1["origin"], node2["origin"]) == (f"https://localhost:{port1}", f"https://localhost:{port2}")
        assert node1["data"] != node2["data"]

        envelope = signed_capsule()
        event_id = json.loads(envelope)["hash"]
        headers = {"content-type": "application/json"}
        with httpx.Client(verify=ssl.create_default_context(cafile=node1["cacert"]), timeout=30) as http1:
            accepted = http1.post(node1["origin"] + "/v1/knowledge/events", content=envelope, headers=headers)
        assert accepted.status_code == 200, accepted.text
        record = accepted.json()
        with httpx.Client(verify=ssl.create_default_context(cafile=node2["cacert"]), timeout=30) as http2:
            found = http2.get(node2["origin"] + f"/v1/knowledge/events/{event_id}")
            assert found.status_code == 200, found.text
            assert found.json() == record, "node 2 serves node 1's record, with its seq"
            assert found.json()["seq"] == record["seq"]
            again = http2.post(node2["origin"] + "/v1/knowledge/events", content=envelope, headers=headers)
            assert again.status_code == 200, again.text
            assert again.json() == record, "a resubmission to the other node returns the original record"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # what Ctrl-C does
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        left = {pid: name for pid, name in started.items() if group_alive(pid)}
        for pid in left:  # never leave anything running, even when the script failed to stop it
            os.killpg(pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert process.returncode == 0, output
    assert not left, f"still running after the cluster stopped: {left}\n{output}"
    assert set(started.values()) == {"redis", "node 1", "node 2"}
    assert "stopped redis-server" in output and not (directory / "cluster.json").exists()
    assert "Traceback" not in output
