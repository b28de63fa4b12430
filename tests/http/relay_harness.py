"""Shared helpers for HTTP, CLI, interop and durability tests.

``relay_app`` builds the real Litestar app over a real ``Relay`` (memory or
SQLite store) with a settable clock; ``served_relay`` runs ``akrelay serve``
as a subprocess over TLS on a free 127.0.0.1 port.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.settings import defaults
from akrelay.store.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
VECTORS: dict[str, Any] = json.loads((ROOT / "tests" / "vectors" / "agent-knowledge-1.0.vectors.json").read_text("utf-8"))
FIXTURES: dict[str, Any] = VECTORS["fixtures"]
NOW: int = VECTORS["now"]
ORIGIN = "https://localhost:8443"


def fixture_bytes(name: str) -> bytes:
    return json.dumps(FIXTURES[name]["envelope"], ensure_ascii=False).encode("utf-8")


def fixture_dict(name: str) -> dict[str, Any]:
    return copy.deepcopy(FIXTURES[name]["envelope"])


def hash_of(name: str) -> str:
    return FIXTURES[name]["envelope"]["hash"]


class Clock:
    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass
class Harness:
    client: TestClient
    relay: Relay
    clock: Clock
    settings: Any
    node: Any
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})

    def submit(self, body: bytes | str, **kw: Any):
        data = body.encode() if isinstance(body, str) else body
        return self.client.post("/v1/knowledge/events", content=data, headers=kw.pop("headers", self.headers), **kw)

    def submit_fixture(self, name: str):
        return self.submit(fixture_bytes(name))

    def batch(self, value: Any):
        body = value if isinstance(value, (bytes, str)) else json.dumps(value)
        return self.client.post("/v1/knowledge/batch", content=body, headers=self.headers)

    def query(self, pairs: list[tuple[str, str]] | str = ""):
        from urllib.parse import urlencode

        qs = pairs if isinstance(pairs, str) else urlencode(pairs)
        return self.client.get("/v1/knowledge/query" + ("?" + qs if qs else ""))


@contextlib.contextmanager
def relay_app(*, store: Any = None, config: RelayConfig | None = None, now: int = NOW,
              extensions: bool = False, **settings_overrides: Any) -> Iterator[Harness]:
    """The real app over a real relay; rate limits off unless asked for.

    ``extensions=False`` builds the core §9.1 app alone (a node without
    components), so these tests hold whatever other areas install.
    """
    overrides = {"write_rate": 0.0, "read_rate": 0.0} | settings_overrides
    settings = defaults(**overrides)
    clock = Clock(now)
    relay = Relay(store if store is not None else MemoryStore(), config or RelayConfig(origin=ORIGIN),
                  clock=clock, cursor_secret=b"k" * 32)
    app = create_app(relay, settings, components=None if extensions else ())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Harness(client, relay, clock, settings, app.state.node)


def error_of(response) -> tuple[int, str]:
    """Status and spec code of an error response, checking the Identity §8.1 shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) <= {"code", "message", "data"} and {"code", "message"} <= set(body["error"]), body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert response.headers["content-type"].startswith("application/json")
    return response.status_code, body["error"]["code"]


# -- real servers -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    process: subprocess.Popen
    origin: str
    data: Path
    cacert: Path
    port: int
    log: Path

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cacert))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)


def serve_command(data: Path, port: int, *, workers: int = 1, origin: str | None = None) -> list[str]:
    """The ``akrelay serve`` command line on 127.0.0.1 (no ``--origin`` when ``origin`` is None)."""
    return ([sys.executable, "-m", "akrelay", "serve", "--data", str(data), "--host", "127.0.0.1",
             "--port", str(port), "--workers", str(workers)] + (["--origin", origin] if origin else []))


class PortTaken(RuntimeError):
    """The free port picked for a relay was taken by another process before the relay bound it."""


def start_relay(data: Path, *, workers: int = 1, port: int | None = None, extra: list[str] | None = None,
                env: dict[str, str] | None = None, host_name: str = "localhost", timeout: float = 120.0,
                pass_origin: bool = True) -> Served:
    """``akrelay serve`` in its own process group; waits until discovery answers over TLS.

    ``pass_origin=False`` leaves the origin to the relay (it derives https://localhost:PORT).
    Without ``port``, a free port is picked; another process may take it between the pick and
    the bind (other tests, other suites on the machine), so that case picks another one.
    """
    for attempt in range(5):
        try:
            return _start_relay_on(data, port or free_port(), workers=workers, extra=extra, env=env,
                                   host_name=host_name, timeout=timeout, pass_origin=pass_origin)
        except PortTaken:
            if port is not None or attempt == 4:
                raise
    raise AssertionError("unreachable")


def _start_relay_on(data: Path, port: int, *, workers: int, extra: list[str] | None, env: dict[str, str] | None,
                    host_name: str, timeout: float, pass_origin: bool) -> Served:
    import httpx

    origin = f"https://{host_name}:{port}"
    log = data.parent / f"{data.name}-serve-{port}.log"
    data.mkdir(parents=True, exist_ok=True)
    args = serve_command(data, port, workers=workers, origin=origin if pass_origin else None) + (extra or [])
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    child_env.update(env or {})
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    served = Served(proc, origin, data, data / "tls-cert.pem", port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            kind = PortTaken if proc.returncode == 2 and "already in use" in text else RuntimeError
            raise kind(f"akrelay serve exited with {proc.returncode}:\n{text}")
        if served.cacert.exists():
            try:
                response = httpx.get(origin + "/.well-known/agent-knowledge", verify=served.ssl_context(), timeout=2)
                if response.status_code == 200:
                    return served
            except (httpx.HTTPError, ssl.SSLError, OSError):
                pass
        time.sleep(0.2)
    served.stop(signal.SIGKILL)
    raise RuntimeError(f"akrelay serve did not answer in {timeout}s:\n{log.read_text(errors='replace')}")
