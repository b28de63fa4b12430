"""The log followers' own process under ``akrelay serve`` (``akrelay.process.followers``).

Checked: the search indexer and the KIP importer run in one low-priority process
that holds both leader locks (the workers only read); what is accepted becomes
searchable and KIP-visible; a killed follower process is replaced and the new one
catches up; a SIGTERM stops everything within a bound and the data survives; and
the launcher's handle respawns only a process that did not end cleanly.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from akrelay.process.followers import NICE, FollowerProcess
from akrelay.kip.wiring import IMPORTER_LOCK

from relay_harness import fixture_bytes, hash_of, start_relay

FAST = ["--write-rate", "0", "--read-rate", "0"]
PID_LINE = re.compile(r"log followers \(search indexer, KIP importer\) in process (\d+)")
LOG_RESPAWN = re.compile(r"followers: pid (\d+) keeps")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _holder(lock: Path) -> int:
    """The pid a leader lock's holder wrote into it (0: none yet)."""
    try:
        return int(lock.read_text().strip() or 0)
    except FileNotFoundError:
        return 0


def _wait(predicate, timeout: float = 120.0, step: float = 0.1):  # noqa: ANN001, ANN202
    """Poll; generous, because the followers' process runs SCHED_IDLE and crawls on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def _searchable(http: httpx.Client, origin: str, names: list[str]) -> bool:
    page = http.post(origin + "/v1/knowledge/search", json={"text": "alpha", "mode": "lexical"}).json()
    found = {hit["record"]["envelope"]["hash"] for hit in page["result"]}
    return page["coverage"]["exhaustive"] and {hash_of(n) for n in names} <= found


def _kip_seq(http: httpx.Client, origin: str) -> int:
    body = {"kip": "2.0", "operations": [{"command": "DESCRIBE SNAPSHOT"}]}
    answer = http.post(origin + "/v1/kip", json=body).json()
    return int(answer["results"][0]["result"]["space_seq"])


def _submit(http: httpx.Client, origin: str, name: str) -> None:
    response = http.post(origin + "/v1/knowledge/events", content=fixture_bytes(name),
                         headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


@pytest.mark.slow
def test_followers_run_in_their_own_process_which_is_replaced_when_killed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    served = start_relay(data, workers=2, extra=FAST)
    try:
        pid = int(_wait(lambda: PID_LINE.search(served.log.read_text()), 60).group(1))
        assert _alive(pid)
        # once started, every thread of it yields the CPU to the workers
        assert _wait(lambda: LOG_RESPAWN.search(served.log.read_text()))
        for tid in os.listdir(f"/proc/{pid}/task"):
            assert os.getpriority(os.PRIO_PROCESS, int(tid)) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
            assert os.sched_getscheduler(int(tid)) == os.SCHED_IDLE
        # both leader locks are this process's, not a worker's
        assert _wait(lambda: _holder(data / IMPORTER_LOCK) == pid and _holder(data / "search" / "indexer.lock") == pid)
        with httpx.Client(verify=served.ssl_context(), timeout=10) as http:
            _submit(http, served.origin, "text_publication")
            assert _wait(lambda: _searchable(http, served.origin, ["text_publication"]))
            assert _wait(lambda: _kip_seq(http, served.origin) == 1)

            os.kill(pid, signal.SIGKILL)
            _submit(http, served.origin, "text_regional")  # accepted while no follower runs
            respawned = _wait(lambda: [int(p) for p in LOG_RESPAWN.findall(served.log.read_text()) if int(p) != pid])
            assert respawned, served.log.read_text()
            new = respawned[-1]
            assert _alive(new) and _wait(lambda: _holder(data / IMPORTER_LOCK) == new)
            # a replacement finds the index and the nexus: it yields from its start, every thread (issue 25)
            for tid in os.listdir(f"/proc/{new}/task"):
                assert os.getpriority(os.PRIO_PROCESS, int(tid)) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
                assert os.sched_getscheduler(int(tid)) == os.SCHED_IDLE
            assert _wait(lambda: _searchable(http, served.origin, ["text_publication", "text_regional"]))
            assert _wait(lambda: _kip_seq(http, served.origin) == 2)

        started = time.monotonic()
        served.process.send_signal(signal.SIGTERM)  # the launcher alone: it stops the followers itself
        served.process.wait(60)
        took = time.monotonic() - started
        # 2 s for the workers, then 2 s for the followers, at most, plus exits (room for a loaded machine)
        assert took < 20, took
        assert _wait(lambda: not _alive(new), 60)
    finally:
        served.stop(signal.SIGKILL)
    restarted = start_relay(data, workers=1, extra=FAST)
    try:
        with httpx.Client(verify=restarted.ssl_context(), timeout=10) as http:
            for name in ("text_publication", "text_regional"):
                assert http.get(restarted.origin + "/v1/knowledge/events/" + hash_of(name)).status_code == 200
            assert _wait(lambda: _searchable(http, restarted.origin, ["text_publication", "text_regional"]))
    finally:
        restarted.stop()


@pytest.mark.slow
def test_followers_in_a_worker_thread_on_request(tmp_path: Path) -> None:
    """``--followers thread``: no separate process; a worker indexes and imports (the earlier design)."""
    data = tmp_path / "data"
    served = start_relay(data, workers=1, extra=FAST + ["--followers", "thread"])
    try:
        assert not PID_LINE.search(served.log.read_text())
        with httpx.Client(verify=served.ssl_context(), timeout=10) as http:
            _submit(http, served.origin, "text_publication")
            assert _wait(lambda: _searchable(http, served.origin, ["text_publication"]))
            assert _kip_seq(http, served.origin) == 1
        assert _holder(data / IMPORTER_LOCK) != 0
    finally:
        served.stop()


def _sleeper(seconds: float, code: int = 0) -> list[str]:
    return [sys.executable, "-c", f"import sys, time; time.sleep({seconds}); sys.exit({code})"]


def test_the_handle_replaces_a_killed_process_and_not_one_that_stopped_cleanly() -> None:
    handle = FollowerProcess(respawn_delay=0.05, argv=_sleeper(60))
    handle.start()
    try:
        first = handle.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert _wait(lambda: handle.pid != first and handle.spawned == 2, 60), handle.spawned
    finally:
        handle.stop(timeout=5)
    assert handle.proc is not None and handle.proc.poll() is not None

    clean = FollowerProcess(respawn_delay=0.05, argv=_sleeper(0.1, 0))
    clean.start()
    clean.proc.wait(10)  # type: ignore[union-attr]
    time.sleep(0.3)
    assert clean.spawned == 1
    clean.stop()


def test_the_handle_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stubborn = [sys.executable, "-c",
                "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"]
    handle = FollowerProcess(respawn_delay=0.05, argv=stubborn)
    handle.start()
    assert _wait(ready.exists, 60)  # the handler is installed
    started = time.monotonic()
    handle.stop(timeout=0.5)
    assert time.monotonic() - started < 30  # killed after 0.5 s, not left to its 60 s sleep
    assert handle.proc is not None and handle.proc.returncode == -signal.SIGKILL
    assert handle.spawned == 1


def test_a_process_asked_to_stop_while_starting_ends_at_once(tmp_path: Path) -> None:
    """A stop right after a start: the process does not finish opening its node only to stop it.

    Its node's open is held here until the test ends (at idle priority behind the workers it
    takes seconds); SIGTERM must end it cleanly, not leave it to the launcher's kill.
    """
    from akrelay.settings import RESOLVED_ENV, defaults

    opening = tmp_path / "opening"
    held = [sys.executable, "-c",
            "import pathlib, threading\n"
            "from akrelay.node import RelayNode\n"
            "from akrelay.process import followers\n"
            "def held(*args, **kwargs):\n"
            f"    pathlib.Path({str(opening)!r}).touch()\n"
            "    threading.Event().wait()\n"
            "RelayNode.open = held\n"
            "raise SystemExit(followers.main())\n"]
    env = {**os.environ, RESOLVED_ENV: defaults(data=str(tmp_path / "data")).to_env()}
    handle = FollowerProcess(env, respawn_delay=0.05, argv=held)
    handle.start()
    try:
        assert _wait(opening.exists, 60)  # in RelayNode.open, its signal handlers installed
    finally:
        handle.stop(timeout=60)
    assert handle.proc is not None and handle.proc.returncode == 0  # ended itself, was not killed
    assert handle.spawned == 1


class _Opened(Exception):
    """Ends :func:`akrelay.process.followers.main` right after it opened its node."""


def test_the_followers_process_leaves_the_store_s_background_threads_to_the_workers(tmp_path: Path,
                                                                                     monkeypatch) -> None:  # noqa: ANN001
    """At idle priority, a trigram indexer holding the store's write lock would stall the workers waiting for it."""
    from akrelay.process import followers
    from akrelay.node import RelayNode
    from akrelay.settings import RESOLVED_ENV, defaults

    opened: list[RelayNode] = []
    real_open = RelayNode.open

    def spy(settings, **kwargs):  # noqa: ANN001, ANN003, ANN202
        opened.append(real_open(settings, **kwargs))
        raise _Opened

    monkeypatch.setattr(RelayNode, "open", spy)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(_Opened):
            followers.main({RESOLVED_ENV: defaults(data=str(tmp_path / "data")).to_env()})
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    node = opened[0]
    try:
        store = node.relay.store
        assert store._indexer is None and store._checkpointer is None  # noqa: SLF001
    finally:
        node.stop()
