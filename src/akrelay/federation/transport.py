"""Guarded HTTPS reads from one configured peer.

Everything a hostile or broken peer can do at the HTTP level is bounded here:
only the peer's own HTTPS origin is contacted, redirects are refused, the
resolved addresses must be public unless the peer is configured otherwise,
trust comes from the peer's CA file alone when it has one (environment CA
variables are ignored: we build the ``ssl.SSLContext`` ourselves and pass
``trust_env=False``), and every request has one deadline that covers all of it:
connecting, TLS, sending, headers and body. Bodies are read raw (no content
coding is ever undone: a coding we did not ask for is refused), capped in bytes
as they arrive and in JSON values before parsing, and parsed as strict I-JSON.
"""

from __future__ import annotations

import email.utils
import ipaddress
import socket
import ssl
import time
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Literal, overload
from urllib.parse import urlsplit

import httpcore
import httpx

from akrelay.boundedhttp import DeadlineStream, budget, deadline, deadline_transport, json_values, unasked_coding
from akrelay.federation.peers import Peer
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import parse_strict

if TYPE_CHECKING:
    # httpcore's own alias for a socket option (its public names do not include it)
    from httpcore._backends.base import SOCKET_OPTION

    from akrelay.jsontypes import JSON

#: Longest Retry-After we honour; a peer cannot park itself for longer than a day.
MAX_RETRY_AFTER = 86_400.0
#: Statuses whose Retry-After is honoured (RFC 6585 §4, RFC 9110 §15.6.4); on any other it is ignored.
RETRY_AFTER_STATUSES = frozenset({429, 503})
#: Bytes of a non-200 body that are read (for its error code); the rest is never read.
MAX_ERROR_BODY = 4096
#: Bytes per JSON value allowed in a body, at the least: parsed JSON costs about 80 bytes
#: of memory per value, so this keeps a parsed body within a small multiple of its cap.
BYTES_PER_VALUE = 64

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
    return sorted({str(info[4][0]) for info in infos})


def is_public_address(address: str) -> bool:
    """``False`` for loopback, private, link-local, shared, reserved, multicast and unspecified."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_addresses(host: str, port: int, *, allow_private: bool, resolver: Resolver) -> list[str]:
    """The addresses of ``host``, refusing any non-public one unless the peer allows it.

    A single private answer is enough to refuse: a name that mixes public and
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
                    socket_options: Iterable[SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        try:
            addresses = self._check(host, port)
        except PeerFetchError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        error: Exception | None = None
        for address in addresses:
            try:
                return DeadlineStream(super().connect_tcp(address, port, budget(timeout, httpcore.ConnectTimeout),
                                                          local_address, socket_options))
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
        # Our network backend dials only the checked addresses, each connection bound by the deadline.
        transport = deadline_transport(ssl_context, _CheckedBackend(self._addresses))
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

    def get_json(self, url: str, params: dict[str, str] | None = None, *, max_bytes: int | None = None) -> JSON:
        return self.get_json_sized(url, params, max_bytes=max_bytes)[0]

    def get_json_sized(self, url: str, params: dict[str, str] | None = None, *,
                       max_bytes: int | None = None) -> tuple[JSON, int]:
        """The parsed body and its size in bytes as received."""
        return self._request("GET", url, params=params, body=None, max_bytes=max_bytes)

    def get_text(self, url: str, *, max_bytes: int = 65536) -> str:
        """A small UTF-8 text body (a signed checkpoint), with the same bounds as JSON reads."""
        return self._request("GET", url, params=None, body=None, max_bytes=max_bytes, raw=True)[0]

    def post_json(self, url: str, body: bytes, *, max_bytes: int | None = None) -> JSON:
        return self._request("POST", url, params=None, body=body, max_bytes=max_bytes)[0]

    def stream_chunks(self, url: str, params: dict[str, str] | None = None, *, idle_timeout: float, lifetime: float,
                      on_open: Callable[[Callable[[], None]], None] | None = None) -> Iterator[bytes]:
        """The raw body of a ``text/event-stream`` answer, chunk by chunk, as it arrives (the push stream).

        The same guards as every other read (origin, addresses, no redirects, no
        content coding), but no size cap: the caller bounds lines and frames. A
        read that waits longer than ``idle_timeout`` (no heartbeat) and the whole
        connection after ``lifetime`` seconds end it as ``timeout``; the end of the
        body ends the iteration. ``on_open(abort)`` gets a function that another
        thread may call to end a blocked read at once.
        """
        self._check_url(url)
        deadline_at = self._monotonic() + lifetime
        timeout = httpx.Timeout(connect=self.peer.connect_timeout, read=idle_timeout, write=self.peer.read_timeout,
                                pool=self.peer.connect_timeout)
        headers = {"accept": "text/event-stream", "cache-control": "no-store"}
        try:
            with deadline(deadline_at, self._monotonic), \
                    self._client.stream("GET", url, params=params, headers=headers, timeout=timeout) as response:
                status = response.status_code
                if status != 200:
                    retry_after = response.headers.get("retry-after") if status in RETRY_AFTER_STATUSES else None
                    kind = "rate_limited" if status == 429 else ("server" if status >= 500 else
                                                                 "redirect" if 300 <= status < 400 else "status")
                    raise PeerFetchError(kind, f"GET {url} answered {status}", status=status, retry_after=retry_after)
                _refuse_content_coding(url, response)
                media = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if media != "text/event-stream":
                    raise PeerFetchError("invalid", f"{url}: content-type {media[:64]!r} is not text/event-stream",
                                         status=status)
                stream = response.extensions.get("network_stream")
                if on_open is not None and stream is not None:
                    on_open(_socket_abort(stream))
                for chunk in response.iter_raw():
                    self.bytes_read += len(chunk)
                    yield chunk
        except httpx.TimeoutException as exc:
            raise PeerFetchError("timeout", f"GET {url}: the stream was silent or open too long "
                                 f"({type(exc).__name__})") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise PeerFetchError("truncated", f"GET {url}: the stream broke off ({exc})") from None
        except httpx.HTTPError as exc:
            raise PeerFetchError("network", f"GET {url}: {type(exc).__name__}: {exc}") from None

    def post_bytes(self, url: str, body: bytes, *, content_type: str, max_bytes: int) -> bytes:
        """POST a binary body and return the binary answer (a reconciliation message), bounded like every read."""
        return self._request("POST", url, params=None, body=body, max_bytes=max_bytes,
                             raw="bytes", content_type=content_type)[0]

    @overload
    def _request(self, method: str, url: str, *, params: dict[str, str] | None, body: bytes | None,
                 max_bytes: int | None, raw: Literal[False] = False,
                 content_type: str = "application/json") -> tuple[JSON, int]: ...

    @overload
    def _request(self, method: str, url: str, *, params: dict[str, str] | None, body: bytes | None,
                 max_bytes: int | None, raw: Literal[True], content_type: str = "application/json") -> tuple[str, int]: ...

    @overload
    def _request(self, method: str, url: str, *, params: dict[str, str] | None, body: bytes | None,
                 max_bytes: int | None, raw: Literal["bytes"],
                 content_type: str = "application/json") -> tuple[bytes, int]: ...

    def _request(self, method: str, url: str, *, params: dict[str, str] | None, body: bytes | None,
                 max_bytes: int | None, raw: bool | str = False,
                 content_type: str = "application/json") -> tuple[JSON | bytes, int]:
        """The body as parsed JSON, or with ``raw`` as text (``True``) or as bytes (``"bytes"``), and its size."""
        self._check_url(url)
        cap = max_bytes or self.peer.max_page_bytes
        deadline_at = self._monotonic() + self.peer.read_timeout
        headers = {"content-type": content_type} if body is not None else None
        try:
            with deadline(deadline_at, self._monotonic), \
                    self._client.stream(method, url, params=params, content=body, headers=headers) as response:
                status = response.status_code
                if 300 <= status < 400:
                    raise PeerFetchError("redirect", f"{method} {url} answered {status} "
                                         "(redirects are never followed)", status=status)
                _refuse_content_coding(url, response)
                declared = response.headers.get("content-length")
                if status == 200 and declared is not None and declared.isdigit() and int(declared) > cap:
                    raise PeerFetchError("too_large", f"{url}: body of {declared} bytes exceeds {cap}",
                                         status=status)
                limit = cap if status == 200 else MAX_ERROR_BODY
                data = bytearray()
                # iter_raw: the bytes as received (chunked framing removed); httpx never decodes them.
                for chunk in response.iter_raw():
                    if len(data) + len(chunk) > limit:
                        if status != 200:  # enough of an error body for its code; the rest is not read
                            data += chunk[:limit - len(data)]
                            break
                        raise PeerFetchError("too_large", f"{url}: body exceeds {cap} bytes", status=status)
                    data += chunk
                    if self._monotonic() > deadline_at:
                        raise self._timed_out(url, status)
                if self._monotonic() > deadline_at:
                    raise self._timed_out(url, status)
                self.bytes_read += len(data)
                retry_after = response.headers.get("retry-after") if status in RETRY_AFTER_STATUSES else None
        except httpx.TimeoutException as exc:
            if self._monotonic() >= deadline_at:
                raise self._timed_out(url, None) from None
            raise PeerFetchError("timeout", f"{method} {url}: {type(exc).__name__}") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise PeerFetchError("truncated", f"{method} {url}: incomplete response ({exc})") from None
        except httpx.HTTPError as exc:
            raise PeerFetchError("network", f"{method} {url}: {type(exc).__name__}: {exc}") from None
        except ssl.SSLError as exc:  # pragma: no cover - httpx wraps these as ConnectError
            raise PeerFetchError("tls", f"{method} {url}: {exc}") from None
        size = len(data)
        if status != 200:
            code = _error_code(bytes(data))
            kind = "rate_limited" if status == 429 else ("server" if status >= 500 else "status")
            raise PeerFetchError(kind, f"{method} {url} answered {status}" + (f" ({code})" if code else ""),
                                 status=status, retry_after=retry_after)
        if raw == "bytes":
            return bytes(data), size
        if raw:
            try:
                return bytes(data).decode("utf-8"), size
            except UnicodeDecodeError:
                raise PeerFetchError("invalid", f"{url}: body is not UTF-8") from None
        return _parse_body(url, data, max_values=max(4096, cap // BYTES_PER_VALUE)), size

    def _timed_out(self, url: str, status: int | None) -> PeerFetchError:
        return PeerFetchError("timeout", f"{url}: response not complete within {self.peer.read_timeout:g}s "
                              "(connection, headers and body)", status=status)


def _socket_abort(network_stream: httpcore.NetworkStream) -> Callable[[], None]:
    """A function that ends a blocked read on ``network_stream`` from another thread (shutdown)."""
    def abort() -> None:
        try:
            sock = network_stream.get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError, ValueError):
            pass
    return abort


def _refuse_content_coding(url: str, response: httpx.Response) -> None:
    """We ask for ``identity``; any other coding is refused before a byte of the body is read."""
    shown = unasked_coding(response)
    if shown is not None:
        raise PeerFetchError("encoding", f"{url}: content-encoding {shown!r} was not asked for "
                             "(we send accept-encoding: identity)", status=response.status_code)


def _parse_body(url: str, data: bytearray, *, max_values: int) -> JSON:
    """Strict I-JSON from a body, with the parse bounded in memory as well as the bytes.

    Parsed JSON can take 25 times the memory of its text (``[{},{},...]``), so the
    JSON values are counted first (an over-estimate: commas and colons inside
    strings count too) and a body holding more than ``max_values`` is refused.
    The buffer is released once decoded, so bytes and parsed values are not all held at once.
    """
    values = json_values(data)
    if values > max_values:
        raise PeerFetchError("too_large", f"{url}: body holds about {values} JSON values, more than {max_values}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PeerFetchError("invalid", f"{url}: body is not strict I-JSON: not valid UTF-8 at byte {exc.start}") \
            from None
    data.clear()
    try:
        return parse_strict(text, code="invalid_request")
    except ProtocolError as exc:
        raise PeerFetchError("invalid", f"{url}: body is not strict I-JSON: {exc.message}") from None


def _error_code(data: bytes) -> str | None:
    """The Identity §8.1 error code of a failure body, if it has one (best effort, for messages)."""
    try:
        value = parse_strict(data[:4096], code="invalid_request")
        error = value.get("error") if isinstance(value, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, str) and len(code) <= 64 else None
    except (ProtocolError, TypeError, KeyError, IndexError, ValueError):  # not an error body of ours
        return None
