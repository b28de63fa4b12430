"""An HTTPS client for Agent Knowledge services (akrelay or any conforming relay).

Trust nothing the service says beyond what it signs: every envelope received is
verified with the protocol core and matched against the ID that was asked for,
every list response must name the origin we asked, and query pages must keep
one checkpoint. Redirects are never followed (a redirect could hand an
envelope or query to another origin) and JSON is parsed strictly (I-JSON).
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlencode, urlsplit

import httpx

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


class ResponseError(Exception):
    """The service answered something a conforming service cannot answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = "invalid_response"
        self.message = message


class ServiceError(Exception):
    """The service refused the request with an Identity §8.1 error body."""

    def __init__(self, status: int, code: str, message: str, data: Any = None, retry_after: str | None = None) -> None:
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


@dataclass
class QueryResult:
    """Every record of a completed enumeration and the checkpoint to persist."""

    records: list[dict[str, Any]]
    checkpoint: int
    as_of: int
    service: str
    pages: int
    page_bodies: list[dict[str, Any]] = field(default_factory=list, repr=False)


class RelayClient:
    """Talks to one service origin. ``cacert`` is a PEM file to trust (self-signed relays)."""

    def __init__(self, relay_url: str, cacert: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None, discover: bool = True) -> None:
        self.origin = origin_of(relay_url)
        self._http = httpx.Client(verify=tls_verify(cacert), timeout=timeout, follow_redirects=False, transport=transport,
                                  headers={"accept": "application/json"})
        self.endpoints = {key: self.origin + "/v1/knowledge/" + key for key in ("events", "query", "batch")}
        self.discovery: dict[str, Any] | None = None
        if discover:
            self.discover()

    # -- plumbing -------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RelayClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_url(self, url: str) -> None:
        try:
            same = origin_of(url) == self.origin
        except ValueError:
            same = False
        if not same:
            raise ResponseError(f"endpoint {url!r} is not on the service origin {self.origin}")

    def _request(self, method: str, url: str, *, body: bytes | None = None) -> Any:
        self._check_url(url)
        headers = {"content-type": "application/json"} if body is not None else None
        return self._checked(self._http.request(method, url, content=body, headers=headers))

    def _checked(self, response: httpx.Response) -> Any:
        """The parsed body of a 200 answer; anything else raises ``ServiceError`` or ``ResponseError``."""
        if response.is_redirect:
            raise ResponseError(f"the service redirected to {response.headers.get('location')!r}; redirects are not followed")
        parsed = self._parse(response.content)
        if response.status_code != 200:
            error = parsed.get("error") if isinstance(parsed, dict) else None
            if not isinstance(error, dict) or not isinstance(error.get("code"), str):
                raise ResponseError(f"HTTP {response.status_code} without an Identity §8.1 error body")
            raise ServiceError(response.status_code, error["code"], str(error.get("message", "")), error.get("data"),
                               response.headers.get("retry-after"))
        return parsed

    @staticmethod
    def _parse(content: bytes) -> Any:
        from akrelay.protocol.ijson import parse_strict

        try:
            return parse_strict(content, code="invalid_response")
        except ProtocolError as exc:
            raise ResponseError(f"response is not strict I-JSON: {exc.message}") from None

    # -- verification -------------------------------------------------------------------------

    @staticmethod
    def verify_record(record: Any, expected_id: str | None = None) -> dict[str, Any]:
        """An acceptance record whose envelope verifies (and has ``expected_id``): the core's rule."""
        with _as_response_error():
            validate_record(record, expected_id)
        return record

    # -- operations ----------------------------------------------------------------------------

    def discover(self) -> dict[str, Any]:
        """Read and validate §9.2 discovery; advertised endpoints replace the defaults."""
        from akrelay.protocol.discovery import validate_discovery

        doc = self._request("GET", self.origin + DISCOVERY_PATH)
        try:
            validate_discovery(doc, self.origin)
        except ProtocolError as exc:
            raise ResponseError(f"invalid discovery document: {exc.message}") from None
        endpoints = doc.get("endpoints", {})
        if not isinstance(endpoints, dict):
            raise ResponseError("discovery endpoints is not an object")
        for key, url in endpoints.items():
            if not isinstance(url, str):
                raise ResponseError(f"endpoint {key} is not a string")
            parts = urlsplit(url)
            if parts.query or parts.fragment or "?" in url or "#" in url:
                raise ResponseError(f"endpoint {key} carries a query or fragment")
            self._check_url(url)
        self.endpoints.update({k: v for k, v in endpoints.items() if k in ("events", "query", "batch", "search")})
        self.discovery = doc
        return doc

    def submit(self, envelope: bytes | dict[str, Any]) -> dict[str, Any]:
        """Submit one envelope; the returned record must carry the same envelope."""
        from akrelay.protocol.envelope import verify_envelope

        raw = envelope if isinstance(envelope, bytes) else json.dumps(envelope, ensure_ascii=False).encode()
        expected = verify_envelope(raw).id
        record = self._request("POST", self.endpoints["events"], body=raw)
        return self.verify_record(record, expected)

    def get(self, event_id: str) -> dict[str, Any]:
        if not isinstance(event_id, str) or not event_id or "/" in event_id:
            raise ValueError(f"not an event ID: {event_id!r}")
        record = self._request("GET", self.endpoints["events"] + "/" + event_id)
        return self.verify_record(record, event_id)

    def query_page(self, params: Sequence[tuple[str, str]] | dict[str, Any]) -> dict[str, Any]:
        pairs = list(params.items()) if isinstance(params, dict) else list(params)
        url = self.endpoints["query"] + ("?" + urlencode(pairs) if pairs else "")
        page = self._request("GET", url)
        with _as_response_error():
            check_list_shape(page, self.origin, max_items=MAX_QUERY_LIMIT)
        return page

    def query_pages(self, params: Sequence[tuple[str, str]] | dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Yield every page of one checkpoint-bound enumeration, checking it as it goes."""
        base = [(k, str(v)) for k, v in (params.items() if isinstance(params, dict) else (params or []))]
        if any(k == "cursor" for k, _ in base):
            raise ValueError("start an enumeration without a cursor")
        after_seq = int(dict(base).get("after_seq", "0") or 0)
        limit = int(dict(base).get("limit", "100") or 100)
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
                event_id = record["envelope"]["hash"]
                if event_id in seen:
                    raise ResponseError(f"record {event_id} repeated")
                seen.add(event_id)
                last_seq = record["seq"]
            yield page
            if cursor is None:
                return

    def query(self, params: Sequence[tuple[str, str]] | dict[str, Any] | None = None) -> QueryResult:
        """Follow every page; the result's ``checkpoint`` is safe to persist as the next ``after_seq``."""
        records: list[dict[str, Any]] = []
        pages: list[dict[str, Any]] = []
        for page in self.query_pages(params):
            pages.append(page)
            records.extend(page["result"])
        first = pages[0]
        return QueryResult(records, first["checkpoint"], first["as_of"], first["service"], len(pages), pages)

    def batch(self, hashes: Sequence[str]) -> dict[str, Any]:
        """Read up to 100 IDs; every ID comes back exactly once, partitions in request order."""
        requested = list(hashes)
        page = self._request("POST", self.endpoints["batch"], body=json.dumps({"hashes": requested}).encode())
        with _as_response_error():
            validate_batch_response(page, requested, self.origin)
        return page

    def search_page(self, body: dict[str, Any]) -> Any:
        """One ranked search (§9.5) at the advertised endpoint; the caller checks the page against its request."""
        return self._request("POST", self.endpoints["search"], body=json.dumps(body).encode())

    def ask(self, document: dict[str, Any], *, on_event: Callable[[dict[str, Any]], None] | None = None,
            timeout: float = 930.0) -> dict[str, Any]:
        """Run one KnowQL turn (``POST /query``) and return its Query document.

        With ``on_event`` the turn is streamed: each progress event (a
        ``QueryEvent``) is passed to it as it arrives, and the final ``query``
        frame is returned. The endpoint comes from discovery's ``knowql`` member
        and must be on this origin.
        """
        member = (self.discovery or {}).get("knowql")
        url = member.get("endpoint") if isinstance(member, dict) else None
        url = url if isinstance(url, str) else self.origin + "/query"
        self._check_url(url)
        body = json.dumps({**document, "stream": on_event is not None}, ensure_ascii=False).encode()
        headers = {"content-type": "application/json"}
        if on_event is None:
            return self._checked(self._http.post(url, content=body, headers=headers, timeout=timeout))
        headers["accept"] = "text/event-stream"
        with self._http.stream("POST", url, content=body, headers=headers, timeout=timeout) as response:
            if response.status_code != 200 or not response.headers.get("content-type", "").startswith(
                    "text/event-stream"):
                response.read()
                return self._checked(response)
            event, data = None, []
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    payload = self._parse("\n".join(data).encode("utf-8"))
                    if event == "query":
                        return payload
                    on_event(payload)
                    event, data = None, []
        raise ResponseError("the event stream ended without its query frame")
