"""The launcher's start order (issue 25, "A fast restart"), without timing anything.

On a restart (the search index and the KIP nexus exist) the launcher starts the
followers' process and goes on to the workers at once; on a first start it waits for
the process to say it is ready, so those files exist before the first request. The
stand-in follower says ready only when the test lets it (a file appears), so "did not
wait" is a fact the test controls, not a duration.
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

from akrelay.process.followers import FollowerProcess, derived_state_exists
from akrelay.process.launcher import start_followers
from akrelay.settings import defaults

#: A follower that says ready (on the launcher's pipe) once ``GATE`` exists, then idles.
STAND_IN = """
import os, pathlib, sys, time
gate = pathlib.Path(sys.argv[1])
while not gate.exists():
    time.sleep(0.02)
os.write(int(os.environ["AKRELAY__FOLLOWERS_READY_FD"]), b"ready\\n")
time.sleep(120)
"""


def _wait(predicate, timeout: float = 60.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def _derived_state(data: Path) -> None:
    (data / "search" / "ranking-id").mkdir(parents=True)
    (data / "kip-nexus.sqlite3").write_bytes(b"")


def test_derived_state_names_match_the_search_index_and_the_nexus(tmp_path: Path) -> None:
    from akrelay.kip.nexus_sqlite import nexus_path
    from akrelay.search.index import index_dir

    assert not derived_state_exists(tmp_path)
    index_dir(tmp_path).mkdir(parents=True)
    assert not derived_state_exists(tmp_path)  # the nexus is missing
    nexus_path(tmp_path).write_bytes(b"")
    assert derived_state_exists(tmp_path)


def test_a_restart_does_not_wait_for_the_followers_process(tmp_path: Path) -> None:
    data, gate = tmp_path / "data", tmp_path / "gate"
    data.mkdir()
    _derived_state(data)
    out = io.StringIO()
    followers = FollowerProcess(argv=[sys.executable, "-c", STAND_IN, str(gate)])
    try:
        start_followers(followers, defaults().replace(data=str(data)), out)
        # returned although the process cannot have said ready: the workers start meanwhile
        assert followers.pid is not None and out.getvalue() == ""
        gate.touch()
        assert _wait(lambda: " ready" in out.getvalue()), out.getvalue()
        assert f"in process {followers.pid} ready" in out.getvalue()
    finally:
        followers.stop()


def test_a_first_start_waits_for_the_followers_to_create_the_index_and_the_nexus(tmp_path: Path) -> None:
    data, gate = tmp_path / "data", tmp_path / "gate"
    data.mkdir()
    gate.touch()  # ready at once: the launcher must have read it before going on
    out = io.StringIO()
    followers = FollowerProcess(argv=[sys.executable, "-c", STAND_IN, str(gate)])
    try:
        start_followers(followers, defaults().replace(data=str(data)), out)
        assert f"in process {followers.pid} ready" in out.getvalue()
    finally:
        followers.stop()


def test_readyz_waits_for_the_kip_runtime_that_opens_after_start(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """Started is not ready while a KIP request would still wait for its runtime to open."""
    import threading

    from litestar.testing import TestClient

    import akrelay.components.kip as kip_component
    from akrelay.process.worker import create_app

    gate = threading.Event()
    real = kip_component.open_runtime

    def gated(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        assert gate.wait(60), "the test never opened the gate"
        return real(*args, **kwargs)

    monkeypatch.setattr(kip_component, "open_runtime", gated)
    settings = defaults(data=str(tmp_path / "data"), write_rate=0.0, read_rate=0.0)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        try:
            assert client.get("/healthz").status_code == 200
            response = client.get("/readyz")
            assert response.status_code == 503, response.text
            assert "the KIP runtime is opening" in response.json()["error"]["message"]
        finally:
            gate.set()
        assert _wait(lambda: client.get("/readyz").status_code == 200)


WORKER_PROBE = """
import json, sys
from akrelay.process.worker import create_app
from akrelay.node import RelayNode
from akrelay.settings import defaults
node = RelayNode.open(defaults(data=sys.argv[1]), follow=False)
create_app(node)
node.stop()
print(json.dumps(sorted(sys.modules)))
"""


def test_a_worker_without_peers_llm_or_redis_loads_none_of_their_clients(tmp_path: Path) -> None:
    """What a worker imports before it answers is what a restart waits for (issue 25): only what is on."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", WORKER_PROBE, str(tmp_path / "data")], capture_output=True,
                         text=True, timeout=300, check=True)
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {"akrelay.components.kip", "akrelay.components.knowql", "akrelay.web"} <= modules  # every component is built
    # pydantic: Litestar's default plugins would import it (and its DTOs) when installed; akrelay uses none
    unused = {"httpx", "redis", "akrelay.federation.runner", "akrelay.federation.sync", "akrelay.knowql.llm",
              "akrelay.knowql.redis_store", "akrelay.store.redis.store", "pydantic", "litestar.plugins.pydantic"}
    assert sorted(unused & modules) == []
