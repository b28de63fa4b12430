"""Suite-wide test settings.

Hypothesis explores new random examples on every local run. Under CI (``CI`` set)
it runs derandomized, so a submission's result does not depend on the draw: a
counterexample found locally becomes a regression test, not a coin flip in CI.
Both profiles drop Hypothesis's per-example deadline (200 ms) and its "too slow" health
check: on a loaded machine they fail a correct test for the machine's speed, not the code.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, print_blob=True, **_UNTIMED)
settings.register_profile("dev", print_blob=True, **_UNTIMED)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# -- a real redis-server, one per test process (pytest-xdist worker) -------------------------------------
import itertools  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from redis_server import RedisServer  # noqa: E402

_redis_db = itertools.count(1)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A ``redis-server`` of this test process (AOF on, ``appendfsync always``), stopped at the end."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of an empty database of the session's server (databases 1..63 in turn, flushed first)."""
    import redis

    db = next(_redis_db) % 63 + 1
    client = redis.Redis.from_url(redis_server.url_for(db))
    try:
        client.flushdb()
    finally:
        client.close()
    return redis_server.url_for(db)


# -- no fixed ports: a bind or an `akrelay serve` on a well-known port fails the test (tests/README.md) ----
import socket  # noqa: E402
import subprocess  # noqa: E402

import port_guard  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _no_fixed_ports():
    """Fail a test that binds a well-known port or serves on the default 8443 (taken on a busy machine)."""
    bind, popen_init = socket.socket.bind, subprocess.Popen.__init__

    def guarded_bind(self, address, *args, **kwargs):
        problem = port_guard.bind_problem(address)
        if problem:
            pytest.fail(problem, pytrace=False)
        return bind(self, address, *args, **kwargs)

    def guarded_init(self, args, *rest, **kwargs):
        problem = port_guard.serve_problem(args, kwargs.get("env"))
        if problem:
            pytest.fail(f"{problem}: {args!r}", pytrace=False)
        popen_init(self, args, *rest, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "bind", guarded_bind)
        patch.setattr(subprocess.Popen, "__init__", guarded_init)
        yield
