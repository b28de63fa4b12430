"""HTTP reads that a hostile server cannot stretch: one deadline, raw bytes, no content coding.

Shared by the federation transport (reads from peers) and :class:`akrelay.client.RelayClient`
(the CLI's reads from a relay). httpcore applies its timeouts to each socket
read, so a server sending one byte per read timeout could hold a request for
as long as it likes; below httpcore the deadline here is absolute. Bodies are
read as received (``iter_raw``: nothing is ever decompressed, so a compression
bomb cannot explode) and counted against a cap as they arrive.
"""

from __future__ import annotations

import ssl
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeAlias, Union

import httpcore
import httpx

#: A socket option as httpcore takes it (``httpcore._backends.base.SOCKET_OPTION``, not exported).
SocketOption: TypeAlias = Union[tuple[int, int, int], tuple[int, int, Union[bytes, bytearray]], tuple[int, int, None, int]]

#: The deadline of the request running in this thread (see :class:`DeadlineStream`).
request_deadline = threading.local()


def budget(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of this thread's request deadline; ``error`` once it has passed."""
    at: float | None = getattr(request_deadline, "at", None)
    if at is None:
        return timeout
    clock: Callable[[], float] = request_deadline.clock
    left = at - clock()
    if left <= 0:
        raise error("the request deadline has passed")
    return left if timeout is None else min(timeout, left)


@contextmanager
def deadline(at: float, clock: Callable[[], float]) -> Iterator[None]:
    """Every socket operation of this thread, until the block ends, shares the deadline ``at``."""
    request_deadline.at, request_deadline.clock = at, clock
    try:
        yield
    finally:
        request_deadline.at = None


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every socket operation gets only what is left of the request's deadline.

    Connect, TLS handshake, writes and every read of the status line, headers
    and body share it, and once it has passed the next operation fails at once.
    Connections are pooled across threads, so the deadline is the one of the
    request running in the calling thread.
    """

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, budget(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, budget(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                    budget(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> object:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.SyncBackend):
    """The system network backend, its connections bound by the request deadline."""

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[SocketOption] | None = None) -> httpcore.NetworkStream:
        return DeadlineStream(super().connect_tcp(host, port, budget(timeout, httpcore.ConnectTimeout),
                                                  local_address, socket_options))


def deadline_transport(ssl_context: ssl.SSLContext, network_backend: httpcore.NetworkBackend | None = None, *,
                       max_connections: int = 4, keepalive_expiry: float = 5.0) -> httpx.HTTPTransport:
    """An httpx transport whose connections obey :func:`deadline` (and go through ``network_backend``)."""
    transport = httpx.HTTPTransport(verify=ssl_context, trust_env=False, retries=0)
    # httpx has no option for the network backend; the pool is replaced with one that has ours.
    transport._pool = httpcore.ConnectionPool(  # noqa: SLF001
        ssl_context=ssl_context, max_connections=max_connections, max_keepalive_connections=2,
        keepalive_expiry=keepalive_expiry, network_backend=network_backend or DeadlineBackend())
    return transport


def unasked_coding(response: httpx.Response) -> str | None:
    """The content codings of ``response`` when any is other than ``identity`` (which is all we ask for).

    Decoding is where a compression bomb explodes (a few KiB of nested gzip
    inflate to gigabytes in one chunk, before any size check can run), so a
    server that ignores ``accept-encoding: identity`` is refused before a byte
    of its body is read.
    """
    codings = [c.strip().lower() for value in response.headers.get_list("content-encoding")
               for c in value.split(",")]
    if any(c and c != "identity" for c in codings):
        return ", ".join(codings)[:100]
    return None


def json_values(data: bytes | bytearray) -> int:
    """An over-estimate of the JSON values in ``data`` (commas and colons inside strings count too).

    Parsed JSON can take 25 times the memory of its text (``[{},{},...]``), so a
    body is refused on this count before it is parsed.
    """
    return data.count(b",") + data.count(b":") + data.count(b"[") + data.count(b"{")
