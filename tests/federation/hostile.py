"""A hostile peer: a real TLS server on 127.0.0.1 whose every answer a test can script.

It speaks just enough HTTP/1.1 to be a peer (keep-alive, ``Content-Length``
request bodies) and hands each request to its *scenario*, which may answer
honestly from a :class:`~tests.federation.conftest.PeerData`, lie in the body,
or misbehave below HTTP semantics: drip header bytes, stream 50 MB, send a
compression bomb. A scenario that returns ``False`` gets the honest answer.

Also here: a TCP ``Sentinel`` that counts connections (it stands for "somewhere
else" in redirect and off-origin tests), and the ``sitecustomize`` text that
records every ``socket.connect`` of a process, so a test can show that nothing
left loopback.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import parse_qsl, urlsplit

from .conftest import PeerData

MAX_HEAD = 64 * 1024


@dataclass
class Request:
    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    body: bytes


class Conn:
    """One accepted TLS connection; writes report whether the client is still there."""

    def __init__(self, sock: ssl.SSLSocket, peer: "HostilePeer") -> None:
        self.sock = sock
        self.peer = peer
        self.keep_alive = True

    def write(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except (OSError, ssl.SSLError):
            self.keep_alive = False
            return False

    def respond(self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = (), *,
                content_length: bool = True) -> bool:
        head = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Scripted'}"]
        head += [f"{k}: {v}" for k, v in headers]
        if content_length:
            head.append(f"content-length: {len(body)}")
        else:
            head.append("connection: close")
            self.keep_alive = False
        return self.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    def json(self, status: int, value: Any, headers: Iterable[tuple[str, str]] = ()) -> bool:
        return self.respond(status, json.dumps(value).encode(), [("content-type", "application/json"), *headers])

    def drip(self, data: Iterable[bytes], delay: float, *, limit: float = 60.0) -> bool:
        """Send ``data`` piece by piece, ``delay`` apart, until the client leaves (or ``limit``)."""
        end = time.monotonic() + limit
        for piece in data:
            if time.monotonic() > end or self.peer.stopping.is_set() or not self.write(piece):
                self.keep_alive = False
                return False
            time.sleep(delay)
        return True


Scenario = Callable[["HostilePeer", Conn, Request], bool]


class HostilePeer:
    """A peer at ``https://127.0.0.1:PORT`` answering as ``scenario`` says (honestly by default)."""

    def __init__(self, cert: str, key: str, scenario: Scenario | None = None, *, name: str = "peer") -> None:
        self.name = name
        self.scenario = scenario
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.origin = f"https://127.0.0.1:{self.port}"
        self.data = PeerData(self.origin)
        self.requests: list[Request] = []
        #: Scenario notes (``done`` when a scripted answer was given in full or abandoned).
        self.events: list[str] = []
        #: When set, scripted answers wait for it (so that heavy scenarios run one at a time).
        self.gate: threading.Event | None = None
        self.stopping = threading.Event()
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(cert, key)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name=f"hostile {name}", daemon=True)
        self._thread.start()

    def note(self, event: str) -> None:
        with self._lock:
            self.events.append(event)

    def count(self, event: str) -> int:
        with self._lock:
            return self.events.count(event)

    def stop(self) -> None:
        self.stopping.set()
        if self.gate is not None:
            self.gate.set()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self) -> None:
        accept_loop(self._listener, self.stopping.is_set, self._start)

    def _start(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.append(sock)
        threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(10)
            sock = self._ctx.wrap_socket(raw, server_side=True)
            conn = Conn(sock, self)
            buffer = b""
            while conn.keep_alive and not self.stopping.is_set():
                request, buffer = _read_request(sock, buffer)
                if request is None:
                    return
                with self._lock:
                    self.requests.append(request)
                self._answer(conn, request)
        except (OSError, ssl.SSLError, ValueError):
            return
        finally:
            with self._lock:
                if raw in self._conns:
                    self._conns.remove(raw)
            raw.close()

    def _answer(self, conn: Conn, request: Request) -> None:
        if self.scenario is not None and self.scenario(self, conn, request):
            return
        data = self.data
        if request.path == "/.well-known/agent-knowledge":
            conn.json(200, data.discovery_doc)
        elif request.path == data.query_path:
            conn.json(*data.query(request.params))
        elif request.path == data.batch_path and request.method == "POST":
            conn.json(*data.batch(json.loads(request.body)["hashes"]))
        else:
            conn.json(404, {"error": {"code": "not_found", "message": request.path}})

    def wait_gate(self) -> bool:
        """Block a scripted answer until the test opens the gate; ``False`` when stopping."""
        if self.gate is not None:
            while not self.gate.wait(0.05):
                if self.stopping.is_set():
                    return False
        return not self.stopping.is_set()


def accept_loop(listener: socket.socket, stopped: Callable[[], bool], handle: Callable[[socket.socket], None]) -> None:
    """Accept until ``stopped()``; polls, because closing a listener does not wake a blocked accept()."""
    listener.settimeout(0.1)
    while not stopped():
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        sock.settimeout(None)
        handle(sock)


def _read_request(sock: ssl.SSLSocket, buffer: bytes) -> tuple[Request | None, bytes]:
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > MAX_HEAD:
            return None, b""
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        buffer += chunk
    head, _, rest = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        rest += chunk
    parts = urlsplit(target)
    request = Request(method, parts.path, dict(parse_qsl(parts.query)), headers, rest[:length])
    return request, rest[length:]


@dataclass
class Sentinel:
    """A loopback TCP listener that only counts who connects to it."""

    hits: int = 0
    stopped: bool = False
    _listener: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))

    def __post_init__(self) -> None:
        self.port = self._listener.getsockname()[1]
        self.origin = f"https://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        accept_loop(self._listener, lambda: self.stopped, self._hit)

    def _hit(self, sock: socket.socket) -> None:
        self.hits += 1
        sock.close()

    def stop(self) -> None:
        self.stopped = True
        self._listener.close()


#: Installed as ``sitecustomize`` for a child process: logs every socket.connect address.
CONNECT_LOGGER = '''
import os, sys
_path = os.environ.get("HOSTILE_CONNECT_LOG")
if _path:
    def _audit(event, args, _path=_path):
        if event == "socket.connect" and isinstance(args[1], tuple):  # inet only, not unix sockets
            with open(_path, "a") as fh:
                fh.write(f"{os.getpid()} {args[1][0]}\\n")
    sys.addaudithook(_audit)
'''


def connected_hosts(log_path: str) -> set[str]:
    """Every host a process with :data:`CONNECT_LOGGER` connected to."""
    try:
        with open(log_path) as fh:
            return {line.split()[1] for line in fh if line.strip()}
    except FileNotFoundError:
        return set()
