"""An HTTPS client for Agent Knowledge services (akrelay or any conforming relay).

Trust nothing the service says beyond what it signs: every envelope received is
verified with the protocol core and matched against the ID that was asked for,
every list response must name the origin we asked, and query pages must keep
one checkpoint. Redirects are never followed (a redirect could hand an
envelope or query to another origin) and JSON is parsed strictly (I-JSON).

Nothing the service sends can make the client unbounded (``akrelay.boundedhttp``):
every request has one deadline covering connect, TLS, headers and body; only
``identity`` is accepted as content coding (a gzip bomb is refused unread);
bodies, event-stream lines and events are counted in raw bytes against caps as
they arrive, and in JSON values before they are parsed. The constructor does no
I/O at all: the TLS context (with ``--cacert``'s file) and the connection pool are
made on the first request, and discovery runs before the first request that needs it.

Answers come back typed (:class:`AcceptanceRecord`, :class:`QueryPage`,
:class:`BatchPage`, :class:`SearchPage`, :class:`Discovery`): the checks that
precede every return guarantee the keys these types name.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, NotRequired, Sequence, TypedDict, cast
from urllib.parse import urlencode, urlsplit

import httpx

from akrelay.boundedhttp import deadline, deadline_transport, json_values, unasked_coding
from akrelay.jsontypes import JSON, JSONObject
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.query import MAX_LIMIT as MAX_QUERY_LIMIT
from akrelay.protocol.records import (
    check_list_shape,
    check_query_shape,
    check_same_scope,
    validate_batch_response,
    validate_record,
)

DISCOVERY_PATH = "/.well-known/agent-knowledge"

#: Largest 200 body read (a query page of 1000 records stays far below it); more is refused.
MAX_BODY = 64 * 1024 * 1024
#: Largest discovery document read: a §9.2 document lists a few endpoints and at most 32 peers.
MAX_DISCOVERY_BYTES = 1024 * 1024
#: Bytes of a non-200 body read for its error code and message; the rest is never read.
MAX_ERROR_BODY = 64 * 1024
#: Largest event-stream line, and largest event (its data lines together); a longer one is refused.
MAX_EVENT_BYTES = 8 * 1024 * 1024
#: Bytes per JSON value allowed in a body at the least (parsed JSON costs about 80 bytes per value).
BYTES_PER_VALUE = 64
#: An event-stream line ends at CRLF, LF or CR (WHATWG HTML, server-sent events).
_LINE_END = re.compile(rb"\r\n|\r|\n")


class ResponseError(Exception):
    """The service answered something a conforming service cannot answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = "invalid_response"
        self.message = message


class ServiceError(Exception):
    """The service refused the request with an Identity §8.1 error body."""

    def __init__(self, status: int, code: str, message: str, data: JSON = None, retry_after: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.data, self.retry_after = status, code, message, data, retry_after


#: Where ``akrelay serve`` keeps the self-signed certificate it creates, relative to where it runs.
DEFAULT_CACERT = "akrelay-data/tls-cert.pem"


def tls_verify(cacert: str | None) -> ssl.SSLContext | bool:
    """What to verify the relay's certificate against: the system store, or only ``cacert`` (PEM).

    A file that is missing or holds no certificate is a ``ValueError`` with a message for the
    user, not an OpenSSL traceback.
    """
    if not cacert:
        return True
    try:
        return ssl.create_default_context(cafile=cacert)
    except ssl.SSLError:
        raise ValueError(f"--cacert {cacert} holds no PEM certificate (expected the relay's tls-cert.pem)") from None
    except OSError as exc:
        raise ValueError(f"cannot read --cacert {cacert}: {exc.strerror or exc}") from None


def _unverified() -> ssl.SSLContext:
    """A context that checks nothing (``akrelay kip --insecure``, for tests only)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _verification_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:  # httpx -> httpcore -> ssl
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def connection_failure(exc: BaseException, relay: str, cacert: str | None) -> str:
    """The message for a request that got no answer, with the next step when TLS trust failed.

    A self-signed relay is the first thing a new user meets, and OpenSSL's own text does not
    say that ``--cacert`` is the way out.
    """
    failed = _verification_error(exc)
    if failed is None:
        return f"cannot reach {relay}: {exc or type(exc).__name__}"
    reason = failed.verify_message or str(failed)
    if cacert:
        hint = (f"the relay's certificate does not verify against --cacert {cacert}: pass this relay's own "
                "certificate (tls-cert.pem in its data directory) and a --relay host name it covers")
    else:
        hint = (f"pass --cacert with the path of the relay's certificate ({DEFAULT_CACERT} by default; "
                "`akrelay serve` prints it at start), or set AKRELAY_CACERT")
    return f"cannot reach {relay}: TLS certificate verification failed: {reason}\nhint: {hint}"


def origin_of(url: str) -> str:
    """The canonical HTTPS origin of ``url`` (``ValueError`` if it has none)."""
    from akrelay.protocol.discovery import canonical_origin

    return canonical_origin(url)


@contextmanager
def _as_response_error() -> Iterator[None]:
    """The protocol core's response checks (§9.3–§9.5) report as this client's ``ResponseError``."""
    try:
        yield
    except ProtocolError as exc:
        raise ResponseError(exc.message) from None


class EnvelopeDocument(TypedDict):
    """A verified envelope as JSON (Identity §4): the event, its ID (``hash``) and the signature."""

    event: JSONObject
    hash: str
    signature: str


class AcceptanceRecord(TypedDict):
    """An acceptance record (§9.3.1) whose envelope verified: the envelope as JSON, when and where it was accepted."""

    envelope: EnvelopeDocument
    accepted_at: int
    seq: int


class QueryPage(TypedDict):
    """One page of ``GET /v1/knowledge/query`` (§9.3.2), its scope checked and its records verified."""

    service: str
    checkpoint: int
    as_of: int
    result: list[AcceptanceRecord]
    next_cursor: NotRequired[str]


class BatchPage(TypedDict):
    """The answer of ``POST /v1/knowledge/batch`` (§9.4): the IDs found, in request order, and the others."""

    service: str
    checkpoint: int
    as_of: int
    result: list[AcceptanceRecord]
    missing: list[str]


class SearchHit(TypedDict):
    """One ranked-search hit (§9.5): a record and, optionally, why it matched."""

    record: AcceptanceRecord
    explanation: NotRequired[str]


class SearchCoverage(TypedDict):
    exhaustive: bool
    reasons: list[str]


class SearchRanking(TypedDict):
    mode: str
    id: str


class SearchPage(TypedDict):
    """One ranked-search page, not yet checked against its request (:func:`validate_search_response` does)."""

    service: str
    checkpoint: int
    as_of: int
    result: list[SearchHit]
    ranking: SearchRanking
    coverage: SearchCoverage
    next_cursor: NotRequired[str]
    #: akrelay's extension: the log seq its index had reached (not checked).
    index_seq: NotRequired[JSON]


class Discovery(TypedDict, total=False):
    """The §9.2 discovery document, validated; members beyond these are extensions (read them with ``.get``)."""

    service: str
    protocol: str
    endpoints: dict[str, str]
    features: list[str]
    search_modes: list[str]
    knowql: JSONObject


#: A KnowQL Query document (``POST /query``): its shape is KnowQL's (docs/knowql.md), not the relay's.
QueryDocument = JSONObject


def _raw(response: httpx.Response) -> Iterator[bytes]:
    """The body's bytes as received, never decoded (a response built in memory is already whole)."""
    if response.is_stream_consumed:  # only a mock transport's answer: it arrived complete
        yield response.content
        return
    yield from response.iter_raw()


@dataclass
class QueryResult:
    """Every record of a completed enumeration and the checkpoint to persist."""

    records: list[AcceptanceRecord]
    checkpoint: int
    as_of: int
    service: str
    pages: int
    page_bodies: list[QueryPage] = field(default_factory=list, repr=False)


class RelayClient:
    """Talks to one service origin. ``cacert`` is a PEM file to trust (self-signed relays).

    ``timeout`` is the deadline of each request as a whole (connect, TLS, headers and
    body), not of each read. ``discover=False`` skips §9.2 discovery and uses the
    default endpoints; otherwise discovery runs before the first request.

    Making one opens nothing and reads nothing: the first request makes the TLS
    context (a bad ``cacert`` is a ``ValueError`` then) and the connection pool.
    """

    def __init__(self, relay_url: str, cacert: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None, discover: bool = True,
                 max_body: int = MAX_BODY, monotonic: Callable[[], float] = time.monotonic,
                 insecure: bool = False) -> None:
        self.origin = origin_of(relay_url)
        self.timeout = timeout
        self.max_body = max_body
        self._monotonic = monotonic
        self._cacert = cacert
        self._insecure = insecure
        self._transport = transport
        self._client: httpx.Client | None = None
        self._closed = False
        self.endpoints = {key: self.origin + "/v1/knowledge/" + key for key in ("events", "query", "batch")}
        self.discovery: Discovery | None = None
        self._discover = discover

    # -- plumbing -------------------------------------------------------------------------

    @property
    def _http(self) -> httpx.Client:
        """The HTTP client, made on first use (the TLS context reads ``cacert`` then)."""
        if self._client is None:
            if self._closed:
                raise RuntimeError("the RelayClient is closed")
            verify = _unverified() if self._insecure else tls_verify(self._cacert)
            transport = self._transport
            if transport is None:  # a mock transport (tests) has no sockets to bind by the deadline
                context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context()
                transport = deadline_transport(context)
            self._client = httpx.Client(verify=verify, timeout=self.timeout, follow_redirects=False,
                                        transport=transport,
                                        headers={"accept": "application/json", "accept-encoding": "identity"})
        return self._client

    def close(self) -> None:
        self._closed = True
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> "RelayClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_url(self, url: str) -> None:
        try:
            same = origin_of(url) == self.origin
        except ValueError:
            same = False
        if not same:
            raise ResponseError(f"endpoint {url!r} is not on the service origin {self.origin}")

    def _request(self, method: str, url: str, *, body: bytes | None = None, max_body: int | None = None) -> JSON:
        headers = {"content-type": "application/json"} if body is not None else None
        with self._exchange(method, url, body=body, headers=headers) as (response, at, seconds):
            return self._checked(response, self._read_body(response, url, (at, seconds), max_body or self.max_body))

    @contextmanager
    def _exchange(self, method: str, url: str, *, body: bytes | None, headers: dict[str, str] | None,
                  timeout: float | None = None) -> Iterator[tuple[httpx.Response, float, float]]:
        """One streamed request under one deadline; yields the response (headers read), the deadline and its seconds.

        Redirects and unasked content codings are refused before the body is read; a
        deadline or transport failure while the caller reads the body is reported here too.
        """
        self._check_url(url)
        seconds = self.timeout if timeout is None else timeout
        at = self._monotonic() + seconds
        try:
            with deadline(at, self._monotonic), \
                    self._http.stream(method, url, content=body, headers=headers, timeout=seconds) as response:
                if response.is_redirect:
                    raise ResponseError(f"the service redirected to {response.headers.get('location')!r}; "
                                        "redirects are not followed")
                coding = unasked_coding(response)
                if coding is not None:
                    raise ResponseError(f"{method} {url}: content-encoding {coding!r} was not asked for "
                                        "(the client sends accept-encoding: identity); the body was not read")
                yield response, at, seconds
        except httpx.TimeoutException as exc:
            if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)) or self._monotonic() < at:
                raise  # no answer at all: the caller says it cannot reach the relay
            raise self._late(method, url, seconds) from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise ResponseError(f"{method} {url}: incomplete response ({exc})") from None

    @staticmethod
    def _late(method: str, url: str, seconds: float) -> ResponseError:
        return ResponseError(f"{method} {url}: no complete response within {seconds:g} s "
                             "(connection, headers and body)")

    def _read_body(self, response: httpx.Response, url: str, limit: tuple[float, float], cap: int) -> bytearray:
        """The raw body, up to ``cap`` bytes for a 200 (more is refused) or :data:`MAX_ERROR_BODY` otherwise."""
        if response.status_code != 200:
            cap = MAX_ERROR_BODY
        declared = response.headers.get("content-length")
        if response.status_code == 200 and declared is not None and declared.isdigit() and int(declared) > cap:
            raise ResponseError(f"{url}: body of {declared} bytes exceeds {cap}")
        data = bytearray()
        for chunk in _raw(response):
            if len(data) + len(chunk) > cap:
                if response.status_code != 200:  # enough of an error body for its code; the rest is not read
                    data += chunk[:cap - len(data)]
                    break
                raise ResponseError(f"{url}: body exceeds {cap} bytes; reading stopped there")
            data += chunk
            if self._monotonic() > limit[0]:
                raise self._late(response.request.method, url, limit[1])
        return data

    def _checked(self, response: httpx.Response, content: bytes | bytearray) -> JSON:
        """The parsed body of a 200 answer; anything else raises ``ServiceError`` or ``ResponseError``."""
        parsed = self._parse(content)
        if response.status_code != 200:
            error = parsed.get("error") if isinstance(parsed, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            if not isinstance(error, dict) or not isinstance(code, str):
                raise ResponseError(f"HTTP {response.status_code} without an Identity §8.1 error body")
            raise ServiceError(response.status_code, code, str(error.get("message", "")), error.get("data"),
                               response.headers.get("retry-after"))
        return parsed

    def _parse(self, content: bytes | bytearray) -> JSON:
        from akrelay.protocol.ijson import parse_strict

        values, most = json_values(content), max(4096, self.max_body // BYTES_PER_VALUE)
        if values > most:
            raise ResponseError(f"response holds about {values} JSON values, more than {most}")
        try:
            return parse_strict(bytes(content), code="invalid_response")
        except ProtocolError as exc:
            raise ResponseError(f"response is not strict I-JSON: {exc.message}") from None

    # -- verification -------------------------------------------------------------------------

    @staticmethod
    def verify_record(record: object, expected_id: str | None = None) -> AcceptanceRecord:
        """An acceptance record whose envelope verifies (and has ``expected_id``): the core's rule."""
        with _as_response_error():
            validate_record(record, expected_id)
        return cast(AcceptanceRecord, record)

    # -- operations ----------------------------------------------------------------------------

    def ensure_discovery(self) -> Discovery | None:
        """The discovery document, read once (``None`` when the client was made with ``discover=False``)."""
        if self.discovery is None and self._discover:
            self.discover()
        return self.discovery

    def _endpoint(self, key: str) -> str:
        self.ensure_discovery()
        return self.endpoints[key]

    def discover(self) -> Discovery:
        """Read and validate §9.2 discovery; advertised endpoints replace the defaults."""
        from akrelay.protocol.discovery import validate_discovery

        doc = self._request("GET", self.origin + DISCOVERY_PATH, max_body=MAX_DISCOVERY_BYTES)
        self._check_service(doc)
        try:
            validate_discovery(doc, self.origin)
        except ProtocolError as exc:
            raise ResponseError(f"invalid discovery document: {exc.message}") from None
        assert isinstance(doc, dict)  # validate_discovery checked that it is an object
        endpoints = doc.get("endpoints", {})
        if not isinstance(endpoints, dict):
            raise ResponseError("discovery endpoints is not an object")
        advertised: dict[str, str] = {}
        for key, url in endpoints.items():
            if not isinstance(url, str):
                raise ResponseError(f"endpoint {key} is not a string")
            parts = urlsplit(url)
            if parts.query or parts.fragment or "?" in url or "#" in url:
                raise ResponseError(f"endpoint {key} carries a query or fragment")
            self._check_url(url)
            if key in ("events", "query", "batch", "search"):
                advertised[key] = url
        self.endpoints.update(advertised)
        self.discovery = cast(Discovery, doc)
        return self.discovery

    def _check_service(self, doc: object) -> None:
        """A relay that names another origin than the one asked: say which is which, and the way out.

        Agent Knowledge §9.2 makes ``service`` equal the origin serving the document and
        every list response names it, so an alias (``127.0.0.1`` for ``localhost``) is
        not accepted: the relay is reached by the origin it says it is.
        """
        from akrelay.protocol.discovery import is_canonical_origin

        service = doc.get("service") if isinstance(doc, dict) else None
        if isinstance(service, str) and is_canonical_origin(service) and service != self.origin:
            raise ResponseError(
                f"you asked for {self.origin}, but the relay there says its origin is {service}; a relay answers "
                f"only by its own origin (Agent Knowledge §9.2)\nhint: use --relay {service} (or restart the "
                f"relay with --origin {self.origin} if that is its public origin)")

    def submit(self, envelope: bytes | Mapping[str, object]) -> AcceptanceRecord:
        """Submit one envelope; the returned record must carry the same envelope."""
        from akrelay.protocol.envelope import verify_envelope

        raw = envelope if isinstance(envelope, bytes) else json.dumps(envelope, ensure_ascii=False).encode()
        expected = verify_envelope(raw).id
        record = self._request("POST", self._endpoint("events"), body=raw)
        return self.verify_record(record, expected)

    def get(self, event_id: str) -> AcceptanceRecord:
        if not isinstance(event_id, str) or not event_id or "/" in event_id:
            raise ValueError(f"not an event ID: {event_id!r}")
        record = self._request("GET", self._endpoint("events") + "/" + event_id)
        return self.verify_record(record, event_id)

    def query_page(self, params: Sequence[tuple[str, str]] | Mapping[str, object]) -> QueryPage:
        pairs = list(params.items()) if isinstance(params, Mapping) else list(params)
        url = self._endpoint("query") + ("?" + urlencode(pairs) if pairs else "")
        page = self._request("GET", url)
        with _as_response_error():
            check_list_shape(page, self.origin, max_items=MAX_QUERY_LIMIT)
        return cast(QueryPage, page)

    def query_pages(self, params: Sequence[tuple[str, str]] | Mapping[str, object] | None = None) -> Iterator[QueryPage]:
        """Yield every page of one checkpoint-bound enumeration, checking it as it goes."""
        base = [(k, str(v)) for k, v in (params.items() if isinstance(params, Mapping) else (params or []))]
        if any(k == "cursor" for k, _ in base):
            raise ValueError("start an enumeration without a cursor")
        try:
            after_seq = int(dict(base).get("after_seq", "0") or 0)
            limit = int(dict(base).get("limit", "100") or 100)
        except ValueError:
            raise ValueError("after_seq and limit take a decimal integer") from None
        cursor: str | None = None
        scope: tuple[int, int] | None = None
        last_seq = after_seq
        seen: set[str] = set()
        while True:
            page = self.query_page(base + ([("cursor", cursor)] if cursor else []))
            with _as_response_error():
                records, cursor = check_query_shape(page, self.origin, after_seq=last_seq, limit=limit)
                scope = check_same_scope(scope, page)
                for record in records:
                    validate_record(record)
            for record in records:
                event_id = str(record["envelope"]["hash"])  # validate_record verified it above
                if event_id in seen:
                    raise ResponseError(f"record {event_id} repeated")
                seen.add(event_id)
                last_seq = record["seq"]
            yield page
            if cursor is None:
                return

    def query(self, params: Sequence[tuple[str, str]] | Mapping[str, object] | None = None) -> QueryResult:
        """Follow every page; the result's ``checkpoint`` is safe to persist as the next ``after_seq``."""
        records: list[AcceptanceRecord] = []
        pages: list[QueryPage] = []
        for page in self.query_pages(params):
            pages.append(page)
            records.extend(page["result"])
        first = pages[0]
        return QueryResult(records, first["checkpoint"], first["as_of"], first["service"], len(pages), pages)

    def batch(self, hashes: Sequence[str]) -> BatchPage:
        """Read up to 100 IDs; every ID comes back exactly once, partitions in request order."""
        requested = list(hashes)
        page = self._request("POST", self._endpoint("batch"), body=json.dumps({"hashes": requested}).encode())
        with _as_response_error():
            validate_batch_response(page, requested, self.origin)
        return cast(BatchPage, page)

    def post_json(self, path: str, value: object, *, timeout: float | None = None) -> tuple[int, JSON]:
        """POST ``value`` to ``path`` on this origin (no discovery): the status and the parsed body,
        or ``None`` when the body is not strict JSON. For APIs whose answers are not §8.1 errors (KIP)."""
        url = self.origin + path
        body = json.dumps(value, ensure_ascii=False).encode()
        with self._exchange("POST", url, body=body, headers={"content-type": "application/json"},
                            timeout=timeout) as (response, at, seconds):
            raw = self._read_body(response, url, (at, seconds), self.max_body)
        try:
            return response.status_code, self._parse(raw)
        except ResponseError:
            return response.status_code, None

    def search_page(self, body: Mapping[str, object]) -> SearchPage:
        """One ranked search (§9.5) at the advertised endpoint; the caller checks the page against its request
        (:func:`akrelay.protocol.records.validate_search_response`) before it trusts the type."""
        return cast(SearchPage, self._request("POST", self._endpoint("search"), body=json.dumps(body).encode()))

    def ask(self, document: Mapping[str, object], *, on_event: Callable[[JSON], None] | None = None,
            timeout: float = 930.0) -> QueryDocument:
        """Run one KnowQL turn (``POST /query``) and return its Query document.

        With ``on_event`` the turn is streamed: each progress event (a
        ``QueryEvent``) is passed to it as it arrives, and the final ``query``
        frame is returned. The endpoint comes from discovery's ``knowql`` member
        and must be on this origin.
        """
        member = (self.ensure_discovery() or {}).get("knowql")
        url = member.get("endpoint") if isinstance(member, dict) else None
        url = url if isinstance(url, str) else self.origin + "/query"
        self._check_url(url)
        body = json.dumps({**document, "stream": on_event is not None}, ensure_ascii=False).encode()
        headers = {"content-type": "application/json"}
        if on_event is not None:
            headers["accept"] = "text/event-stream"
        with self._exchange("POST", url, body=body, headers=headers, timeout=timeout) as (response, at, seconds):
            if on_event is None or response.status_code != 200 or not response.headers.get(
                    "content-type", "").startswith("text/event-stream"):
                return cast(QueryDocument,
                            self._checked(response, self._read_body(response, url, (at, seconds), self.max_body)))
            event, data, size = None, [], 0
            for line in self._event_lines(response, url, (at, seconds)):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    size += len(line)
                    if size > MAX_EVENT_BYTES:
                        raise ResponseError(f"{url}: an event's data exceeds {MAX_EVENT_BYTES} bytes")
                    data.append(line[5:].strip())
                elif not line and data:
                    payload = self._parse("\n".join(data).encode("utf-8"))
                    if event == "query":
                        return cast(QueryDocument, payload)
                    on_event(payload)
                    event, data, size = None, [], 0
        raise ResponseError("the event stream ended without its query frame")

    def _event_lines(self, response: httpx.Response, url: str, limit: tuple[float, float]) -> Iterator[str]:
        """The lines of an event stream (CRLF, LF or CR ended), each and all of them capped in raw bytes."""
        pending = bytearray()
        total = 0
        for chunk in _raw(response):
            total += len(chunk)
            if total > self.max_body:
                raise ResponseError(f"{url}: the event stream exceeds {self.max_body} bytes; reading stopped there")
            scan = max(0, len(pending) - 1)  # what was scanned before holds no line end (but a last CR)
            pending += chunk
            start = 0
            for end in _LINE_END.finditer(pending, scan):
                if end.group() == b"\r" and end.end() == len(pending):
                    break  # a CR at the end of what has arrived may be the first half of CRLF
                yield self._line(pending[start:end.start()], url)
                start = end.end()
            del pending[:start]
            if len(pending) > MAX_EVENT_BYTES:
                raise ResponseError(f"{url}: an event-stream line exceeds {MAX_EVENT_BYTES} bytes; "
                                    "reading stopped there")
            if self._monotonic() > limit[0]:
                raise self._late("POST", url, limit[1])
        if pending:
            yield self._line(pending, url)

    @staticmethod
    def _line(raw: bytes | bytearray, url: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ResponseError(f"{url}: event stream is not UTF-8 at byte {exc.start} of a line") from None
