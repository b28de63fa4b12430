"""Guarded HTTPS reads from one configured peer.

Everything a hostile or broken peer can do at the HTTP level is bounded here:
only the peer's own HTTPS origin is contacted, redirects are refused, the
resolved addresses must be public unless the peer is configured otherwise,
trust comes from the peer's CA file alone when it has one (environment CA
variables are ignored: we build the ``ssl.SSLContext`` ourselves and pass
``trust_env=False``), connect time and the *whole* response time are capped,
bodies are size-capped while streaming, and JSON is parsed as strict I-JSON.
"""

from __future__ import annotations

import email.utils
import ipaddress
import socket
import ssl
import time
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

import httpcore
import httpx

from akrelay.federation.peers import Peer
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import parse_strict

#: Longest Retry-After we honour; a peer cannot park itself for longer than a day.
MAX_RETRY_AFTER = 86_400.0

Resolver = Callable[[str, int], Iterable[str]]


class PeerFetchError(Exception):
    """A request to a peer failed; ``kind`` says how, for status and back-off."""

    def __init__(self, kind: str, message: str, *, status: int | None = None,
                 retry_after: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        #: The raw ``Retry-After`` header; the engine interprets it with its own clock.
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise PeerFetchError("network", f"cannot resolve {host}: {exc.strerror or exc}") from None
    return sorted({info[4][0] for info in infos})


def is_public_address(address: str) -> bool:
    """``False`` for loopback, private, link-local, shared, reserved, multicast and unspecified."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_addresses(host: str, port: int, *, allow_private: bool, resolver: Resolver) -> list[str]:
    """The addresses of ``host``, refusing any non-public one unless the peer allows it.

    Any single private answer is enough to refuse: a name that mixes public and
    private addresses is the usual shape of a rebinding attempt.
    """
    try:
        addresses = [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        addresses = list(resolver(host, port))
    if not addresses:
        raise PeerFetchError("network", f"{host} has no addresses")
    if not allow_private:
        for address in addresses:
            if not is_public_address(address):
                raise PeerFetchError(
                    "refused", f"{host} resolves to non-public address {address}; "
                    "set allow_private for this peer to permit it")
    return addresses


class _CheckedBackend(httpcore.SyncBackend):
    """Connects only to addresses that passed :func:`check_addresses`, resolved once.

    Resolving in the check and again inside the HTTP library would let a DNS
    answer change in between (rebinding); here the checked address is the one
    dialled, while TLS still verifies the certificate against the host name.
    """

    def __init__(self, check: Callable[[str, int], list[str]]) -> None:
        self._check = check

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        try:
            addresses = self._check(host, port)
        except PeerFetchError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        error: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(int(value)), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return min(max(0.0, when.timestamp() - now), MAX_RETRY_AFTER)


def build_ssl_context(peer: Peer) -> ssl.SSLContext:
    """A verifying context; with ``ca_file`` only that bundle is trusted."""
    try:
        if peer.ca_file:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=peer.ca_file)
        else:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    except (OSError, ssl.SSLError) as exc:
        raise PeerFetchError("tls", f"cannot load CA file {peer.ca_file}: {exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class PeerTransport:
    """One peer's HTTP client. Use as a context manager; not shared across peers."""

    def __init__(self, peer: Peer, *, resolver: Resolver | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.peer = peer
        self._resolver = resolver or system_resolver
        self._monotonic = monotonic
        parts = urlsplit(peer.origin)
        self._host = parts.hostname or ""
        self._port = parts.port or 443
        ssl_context = build_ssl_context(peer)
        transport = httpx.HTTPTransport(verify=ssl_context, trust_env=False, retries=0)
        transport._pool = httpcore.ConnectionPool(  # our backend: dial only checked addresses
            ssl_context=ssl_context, max_connections=4, max_keepalive_connections=2, keepalive_expiry=5.0,
            network_backend=_CheckedBackend(self._addresses))
        self._client = httpx.Client(
            transport=transport,
            verify=ssl_context,
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(connect=peer.connect_timeout, read=peer.read_timeout,
                                  write=peer.read_timeout, pool=peer.connect_timeout),
            headers={"accept": "application/json", "user-agent": "akrelay-sync/1",
                     "accept-encoding": "identity"},
        )
        self.bytes_read = 0

    def __enter__(self) -> "PeerTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _addresses(self, host: str, port: int) -> list[str]:
        if host.strip("[]").lower() != self._host.strip("[]").lower() or port != self._port:
            raise PeerFetchError("refused", f"{host}:{port} is not the configured origin {self.peer.origin}")
        return check_addresses(host, port, allow_private=self.peer.allow_private, resolver=self._resolver)

    def _check_url(self, url: str) -> None:
        if url != self.peer.origin and not url.startswith(self.peer.origin + "/"):
            raise PeerFetchError("refused", f"{url} is not on the configured origin {self.peer.origin}")
        # Checked here as well, so that a refusal is reported as such (and under test mocks).
        check_addresses(self._host, self._port, allow_private=self.peer.allow_private, resolver=self._resolver)

    def get_json(self, url: str, params: dict[str, str] | None = None, *, max_bytes: int | None = None) -> Any:
        return self._request("GET", url, params=params, body=None, max_bytes=max_bytes)

    def post_json(self, url: str, body: bytes, *, max_bytes: int | None = None) -> Any:
        return self._request("POST", url, params=None, body=body, max_bytes=max_bytes)

    def _request(self, method: str, url: str, *, params: dict[str, str] | None, body: bytes | None,
                 max_bytes: int | None) -> Any:
        self._check_url(url)
        cap = max_bytes or self.peer.max_page_bytes
        deadline = self._monotonic() + self.peer.read_timeout
        headers = {"content-type": "application/json"} if body is not None else None
        try:
            with self._client.stream(method, url, params=params, content=body, headers=headers) as response:
                if 300 <= response.status_code < 400:
                    raise PeerFetchError("redirect", f"{method} {url} answered {response.status_code} "
                                         "(redirects are never followed)", status=response.status_code)
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > cap:
                    raise PeerFetchError("too_large", f"{url}: body of {declared} bytes exceeds {cap}",
                                         status=response.status_code)
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > cap:
                        raise PeerFetchError("too_large", f"{url}: body exceeds {cap} bytes",
                                             status=response.status_code)
                    if self._monotonic() > deadline:
                        raise PeerFetchError("timeout", f"{url}: response not complete within "
                                             f"{self.peer.read_timeout:g}s", status=response.status_code)
                    chunks.append(chunk)
                if self._monotonic() > deadline:
                    raise PeerFetchError("timeout", f"{url}: response not complete within "
                                         f"{self.peer.read_timeout:g}s", status=response.status_code)
                data = b"".join(chunks)
                self.bytes_read += size
                status = response.status_code
                retry_after = response.headers.get("retry-after")
        except httpx.TimeoutException as exc:
            raise PeerFetchError("timeout", f"{method} {url}: {type(exc).__name__}") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise PeerFetchError("truncated", f"{method} {url}: incomplete response ({exc})") from None
        except httpx.HTTPError as exc:
            raise PeerFetchError("network", f"{method} {url}: {type(exc).__name__}: {exc}") from None
        except ssl.SSLError as exc:  # pragma: no cover - httpx wraps these as ConnectError
            raise PeerFetchError("tls", f"{method} {url}: {exc}") from None
        if status != 200:
            code = _error_code(data)
            kind = "rate_limited" if status == 429 else ("server" if status >= 500 else "status")
            raise PeerFetchError(kind, f"{method} {url} answered {status}" + (f" ({code})" if code else ""),
                                 status=status, retry_after=retry_after)
        try:
            return parse_strict(data, code="invalid_request")
        except ProtocolError as exc:
            raise PeerFetchError("invalid", f"{url}: body is not strict I-JSON: {exc.message}") from None


def _error_code(data: bytes) -> str | None:
    """The Identity §8.1 error code of a failure body, if it has one (best effort, for messages)."""
    try:
        value = parse_strict(data[:4096], code="invalid_request")
        code = value["error"]["code"]
        return code if isinstance(code, str) and len(code) <= 64 else None
    except Exception:
        return None
