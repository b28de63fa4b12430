"""``/readyz`` comes back within seconds of Redis coming back (issue 24 item 9): nothing of a failure outlives it."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from akrelay.http import health
from akrelay.http.health import Readiness
from redis_server import RedisServer

from relay_harness import start_relay
from test_redis_node import HEADERS, publication


def test_a_stuck_probe_is_given_up_for_a_fresh_one(monkeypatch) -> None:
    """A ping stuck on a dead connection (until its timeouts) must not keep the node unready afterwards."""
    monkeypatch.setattr(health, "PROBE_STUCK", 0.2, raising=False)
    release = threading.Event()
    calls: list[float] = []

    class Store:
        def ping(self) -> None:
            calls.append(time.monotonic())
            if len(calls) == 1:
                release.wait(60)  # the first probe hangs; Redis answers every later one

    readiness = Readiness(Store(), lambda: True)  # type: ignore[arg-type]

    async def main() -> float | None:
        assert await readiness.check() is not None  # the stuck probe: "did not answer within 1.5 s"
        started = time.monotonic()
        while time.monotonic() - started < 20:
            if await readiness.check() is None:
                return time.monotonic() - started
            await asyncio.sleep(0.05)
        return None

    try:
        took = asyncio.run(main())
    finally:
        release.set()
        readiness.close()
    assert took is not None, "/readyz never came back while the first probe hung"
    assert len(calls) >= 2


@pytest.mark.slow
def test_readyz_is_back_within_seconds_of_a_redis_restart_after_kill_9(tmp_path) -> None:
    """The real command, two workers, under ingest: kill -9 Redis, restart it on the same port, poll /readyz."""
    server = RedisServer(tmp_path / "redis").start()
    served = start_relay(tmp_path / "node", workers=2, extra=["--store", server.url])
    stop = threading.Event()

    def ingest() -> None:
        with httpx.Client(verify=served.ssl_context(), timeout=15) as client:
            while not stop.is_set():
                try:
                    client.post(served.origin + "/v1/knowledge/events", content=publication("load"), headers=HEADERS)
                except httpx.HTTPError:
                    pass
                stop.wait(0.01)

    writers = [threading.Thread(target=ingest) for _ in range(2)]
    for writer in writers:
        writer.start()

    def ready_on_fresh_connections(times: int) -> bool:
        """``times`` answers of 200 in a row, each on a new connection (so both workers answer)."""
        for _ in range(times):
            with httpx.Client(verify=served.ssl_context(), timeout=5) as client:
                if client.get(served.origin + "/readyz").status_code != 200:
                    return False
        return True

    try:
        # discovery answers before every worker is ready (/readyz waits for each worker's KIP runtime)
        settled = time.monotonic() + 60
        while not ready_on_fresh_connections(4):
            assert time.monotonic() < settled, "/readyz never 200 on every worker before the fault"
            time.sleep(0.1)
        server.kill()
        deadline = time.monotonic() + 10
        while ready_on_fresh_connections(1):
            assert time.monotonic() < deadline, "/readyz stayed 200 with Redis killed"
            time.sleep(0.05)
        time.sleep(3)  # an outage of some seconds (not a condition: the length of the fault)
        server.start()  # the same port and directory: replays the AOF
        back = time.monotonic()
        while not ready_on_fresh_connections(6):
            assert time.monotonic() - back < 10, "/readyz not 200 on every worker within 10 s of Redis's return"
            time.sleep(0.1)
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=30)
        served.stop()
        server.kill()
    log = served.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
