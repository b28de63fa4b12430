"""A real ``redis-server`` for the tests: started on a free loopback port, in a directory of its own.

The store contract runs against the real server, never a mock (issue 15). The binary comes
from the distribution's package (``.ci/run`` installs ``redis-server`` where it is missing).
Where it is missing outside CI the Redis tests are skipped with the reason; under CI they fail.

:class:`RedisServer` can also be killed with ``SIGKILL`` and restarted on the same port and
directory, which is how the fault tests replay the append-only file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

BINARY = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)


def require_redis_server() -> str:
    """The binary's path; skip (fail under CI) when the machine has none."""
    if BINARY is None:
        message = "redis-server is not installed (apt-get install redis-server; .ci/run does this)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return BINARY


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process with AOF on and ``appendfsync always`` (the durable setting)."""

    def __init__(self, directory: Path, *, port: int | None = None, appendfsync: str = "always",
                 appendonly: bool = True, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = require_redis_server()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.appendonly = appendonly
        #: more ``redis-server`` arguments (e.g. ``--rename-command CONFIG ""``, as managed services run it)
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def url_for(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
            "--save", "", "--protected-mode", "yes", "--daemonize", "no", "--databases", "64",
            "--logfile", str(self.directory / "redis.log"), *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
            if self.ping():
                return self
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """``SIGKILL``: no shutdown, no final AOF rewrite (the fault tests' crash)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def restart(self) -> "RedisServer":
        self.kill()
        return self.start()


@contextlib.contextmanager
def redis_url_or_server(url: str | None, directory: Path) -> Iterator[str]:
    """``url`` as given, else the URL of a durable :class:`RedisServer` of its own in ``directory``, stopped after.

    For the benches (``--redis URL`` or a server of their own).
    """
    if url is not None:
        yield url
        return
    server = RedisServer(directory).start()
    try:
        yield server.url
    finally:
        server.stop()
