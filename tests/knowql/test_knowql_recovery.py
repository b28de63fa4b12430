"""No session stays busy because its turn's process died or Redis went away (issue 24, item 7)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

from akrelay.knowql import recovery
from akrelay.knowql.store import SqliteTurnStore
from redis_server import RedisServer

from .kq_harness import knowql_app


def _query(qid: str, owner: dict | None) -> dict:
    doc = {"id": qid, "object": "query", "status": "in_progress", "_started": 0.0, "_timeout": 900, "error": None,
           "input": [{"role": "user", "content": "cache"}], "output": []}
    if owner is not None:
        doc["_owner"] = owner
    return doc


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_turns_of_a_dead_process_are_failed_at_start(tmp_path) -> None:
    me = recovery.owner()
    owners = {
        "qry_dead": {**me, "pid": _dead_pid(), "boot": "old"},           # kill -9, then a restart
        "qry_reused": {**me, "boot": "an-earlier-start"},                # the restart got the same pid
        "qry_live": {**me, "pid": _live_pid(), "boot": "other"},         # another worker, still running
        "qry_elsewhere": {**me, "host": "another-host", "pid": 1},       # another node's: left to its deadline
    }
    store = SqliteTurnStore.in_data_dir(tmp_path)
    for n, (qid, owner) in enumerate(owners.items()):
        store.create_turn({"id": f"ses_{n}", "scope": ["knowledge"]}, f"ses_{n}", _query(qid, owner), deadline=4e9)
    store.close()
    with knowql_app(tmp_path) as kq:
        status = {qid: kq.client.get(f"/queries/{qid}").json() for qid in owners}
        assert status["qry_dead"]["status"] == status["qry_reused"]["status"] == "failed"
        assert "stopped before the turn ended" in status["qry_dead"]["error"]
        assert status["qry_live"]["status"] == status["qry_elsewhere"]["status"] == "in_progress"
        # the dead turn's session takes a new turn at once (no 409 session_busy)
        again = kq.ask({"ask": "cache restart", "session_id": "ses_0"})
        assert again.status_code == 200, again.text


_sleeper: subprocess.Popen | None = None


def _live_pid() -> int:
    global _sleeper
    _sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    return _sleeper.pid


def teardown_module() -> None:
    if _sleeper is not None:
        _sleeper.kill()
        _sleeper.wait()


def test_a_turn_interrupted_by_a_redis_outage_ends_once_redis_is_back(tmp_path, slow, caplog) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        with knowql_app(store=server.url) as kq:
            kq.submit(kq.corpus.publish("alice", "Cache clears on restart", "Restart clears the cache."))
            turn = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "model": "test/slow",
                           "background": True}).json()
            assert slow.entered.wait(30)
            caplog.clear()
            server.kill()
            slow.gate.set()  # the turn goes on and meets the outage at its next write
            service = kq.node.knowql.engine
            _until(lambda: len(service.deferred) == 1)
            server.start()
            _until(lambda: kq.client.get(f"/queries/{turn['id']}").json().get("status") not in (None, "in_progress"))
            final = kq.client.get(f"/queries/{turn['id']}").json()
            assert final["status"] in ("completed", "failed"), final
            if final["status"] == "failed":
                assert "unreachable" in final["error"]
            # the session is free again
            assert kq.ask({"ask": "cache", "session_id": turn["session_id"]}).status_code == 200
    finally:
        server.kill()
    outage = [r for r in caplog.records if "turn store is unreachable" in r.getMessage()]
    assert len(outage) == 1, [r.getMessage() for r in caplog.records]
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)


def _until(condition, seconds: float = 30.0) -> None:
    done = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        done.wait(0.05)
    raise AssertionError("condition not reached")
