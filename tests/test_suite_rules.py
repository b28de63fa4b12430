"""The suite's rules against flakiness (tests/README.md): the fixed-port guard and untimed Hypothesis."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings

from port_guard import bind_problem, serve_problem

SERVE = [sys.executable, "-m", "akrelay", "serve", "--data", "d"]


def test_well_known_ports_are_refused_and_free_ones_allowed() -> None:
    assert "8443" in bind_problem(("127.0.0.1", 8443))
    assert "6379" in bind_problem(("::1", 6379, 0, 0))
    assert bind_problem(("127.0.0.1", 0)) is None and bind_problem(("127.0.0.1", 43211)) is None
    assert bind_problem("/tmp/a.sock") is None


@pytest.mark.parametrize("argv, env, refused", [
    (SERVE, {}, True),
    (["/venv/bin/akrelay", "serve"], {}, True),
    (SERVE + ["--port", "40123"], {}, False),
    (SERVE + ["--port=40123"], {}, False),
    (SERVE, {"AKRELAY_PORT": "40123"}, False),
    (SERVE + ["--help"], {}, False),
    ([sys.executable, "-m", "akrelay", "sync", "--once"], {}, False),
    ("akrelay serve", {}, False),  # a shell string: not inspected
])
def test_serve_on_its_default_port_is_refused(argv, env, refused) -> None:
    assert (serve_problem(argv, env) is not None) is refused


def test_the_conftest_guard_fails_a_test_that_binds_8443() -> None:
    with socket.socket() as sock, pytest.raises(pytest.fail.Exception, match="well-known port 8443"):
        sock.bind(("127.0.0.1", 8443))


def test_the_conftest_guard_fails_a_test_that_serves_on_the_default_port() -> None:
    env = {"PATH": "/usr/bin"}
    with pytest.raises(pytest.fail.Exception, match="default port 8443"):
        subprocess.Popen(SERVE, env=env)


def test_hypothesis_examples_have_no_wall_clock_deadline() -> None:
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check
