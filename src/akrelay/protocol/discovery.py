"""The discovery document (Agent Knowledge §9.2): building it and checking it.

Origins are compared in their canonical serialized form (lowercase host, IDNA,
compressed IPv6, normalized IPv4, no default port, no path), so a client can
insist that ``service`` and every endpoint belong to the origin it asked.
Client-side defects are reported as ``invalid_discovery`` (a local diagnosis,
not a wire error).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from akrelay.jsontypes import JSON, JSONObject
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import https_url_problem, is_nonempty_text

PROTOCOL = "agent-knowledge/1.0"
RANKED_SEARCH = "ranked-search"
#: The akrelay push stream (``GET /v1/knowledge/stream``): the feature requires ``endpoints.stream``.
PUSH = "push"
STREAM_PATH = "/v1/knowledge/stream"
MAX_PEERS = 32
MAX_SAFE = 2**53 - 1
ENDPOINT_PATHS = {
    "events": "/v1/knowledge/events",
    "query": "/v1/knowledge/query",
    "batch": "/v1/knowledge/batch",
    "search": "/v1/knowledge/search",
}
_ENDPOINT_RE = re.compile(r"https://[^/?#@]+(?:/[^?#]*)?")
_ORIGIN_RE = re.compile(r"https://[^/?#@\s]+")
_IPV4_LAST_LABEL = re.compile(r"(?:[0-9]+|0[xX][0-9a-fA-F]*)")


def _bad(message: str) -> ProtocolError:
    return ProtocolError("invalid_discovery", message)


def canonical_origin(url: str) -> str:
    """The serialized HTTPS origin of ``url``; ``ValueError`` if it has none."""
    problem = https_url_problem(url)
    if problem is not None:
        raise ValueError(problem)
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        if parts.netloc.startswith("["):
            host = "[" + ipaddress.IPv6Address(host).compressed + "]"
        else:
            if not host.isascii():
                host = host.encode("idna").decode("ascii").lower()
            if _IPV4_LAST_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1] or "x"):
                host = str(ipaddress.IPv4Address(host))
    except (ValueError, UnicodeError) as exc:
        raise ValueError(f"host is not valid: {exc}") from None
    port = parts.port
    return "https://" + host + (f":{port}" if port is not None and port != 443 else "")


def is_canonical_origin(value: object) -> bool:
    """``value`` is exactly its own serialized origin (no path, no :443, lowercase)."""
    if type(value) is not str or _ORIGIN_RE.fullmatch(value) is None:
        return False
    try:
        return canonical_origin(value) == value
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Discovery:
    """What a client may rely on from a validated discovery document."""

    service: str
    endpoints: dict[str, str]
    features: tuple[str, ...] = ()
    search_modes: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)

    @property
    def ranked_search(self) -> bool:
        return RANKED_SEARCH in self.features

    @property
    def stream(self) -> str | None:
        """The push stream's URL when the service advertises one (the ``push`` feature)."""
        return self.endpoints.get("stream") if PUSH in self.features else None


def _string_array(doc: Mapping[str, object], key: str) -> list[str]:
    value = doc[key]
    if type(value) is not list or not all(is_nonempty_text(v) for v in value):
        raise _bad(f"{key} must be an array of non-empty strings")
    if len(set(value)) != len(value):
        raise _bad(f"{key} must not repeat values")
    return value


def validate_discovery(doc: object, origin: str) -> Discovery:
    """Check a discovery document fetched from ``origin`` (client side)."""
    if not is_canonical_origin(origin):
        raise _bad(f"requested origin {origin!r} is not a canonical HTTPS origin")
    if type(doc) is not dict:
        raise _bad("discovery document must be an object")
    if doc.get("protocol") != PROTOCOL:
        raise _bad(f"protocol must be {PROTOCOL!r}")
    service = doc.get("service")
    if not is_canonical_origin(service):
        raise _bad("service must be a canonical HTTPS origin")
    if service != origin:
        raise _bad(f"the document fetched from {origin!r} names the service {service!r}; "
                   "service must equal the origin serving it")
    features = tuple(_string_array(doc, "features")) if "features" in doc else ()
    ranked = RANKED_SEARCH in features
    endpoints_doc = doc.get("endpoints", {})
    if type(endpoints_doc) is not dict:
        raise _bad("endpoints must be an object")
    endpoints = {name: origin + path for name, path in ENDPOINT_PATHS.items() if name != "search"}
    if PUSH in features and "stream" not in endpoints_doc:
        raise _bad("the push feature requires endpoints.stream")
    for name in (*ENDPOINT_PATHS, "stream") if PUSH in features else ENDPOINT_PATHS:
        if name not in endpoints_doc:
            continue
        url = endpoints_doc[name]
        if type(url) is not str or _ENDPOINT_RE.fullmatch(url) is None:
            raise _bad(f"endpoint {name!r} must be an https URL without query or fragment")
        try:
            same = canonical_origin(url) == origin
        except ValueError as exc:
            raise _bad(f"endpoint {name!r} is not a valid URL: {exc}") from None
        if not same:
            raise _bad(f"endpoint {name!r} is not on the service origin")
        endpoints[name] = url
    modes: tuple[str, ...] = ()
    if ranked:
        if "search" not in endpoints_doc:
            raise _bad("the ranked-search feature requires endpoints.search")
        if "search_modes" not in doc:
            raise _bad("the ranked-search feature requires search_modes")
        modes = tuple(_string_array(doc, "search_modes"))
        if "lexical" not in modes:
            raise _bad("search_modes must include lexical")
    elif "search" in endpoints_doc or "search_modes" in doc:
        raise _bad("endpoints.search and search_modes require the ranked-search feature")
    peers: tuple[str, ...] = ()
    if "peers" in doc:
        value = doc["peers"]
        if type(value) is not list or len(value) > MAX_PEERS:
            raise _bad(f"peers must be an array of at most {MAX_PEERS} origins")
        if len(set(map(str, value))) != len(value):
            raise _bad("peers must be distinct")
        for peer in value:
            if not is_canonical_origin(peer):
                raise _bad(f"peer {peer!r} is not a canonical HTTPS origin")
            if peer == service:
                raise _bad("a service must not list itself as a peer")
        peers = tuple(value)
    limits: dict[str, int] = {}
    if "limits" in doc:
        value = doc["limits"]
        if type(value) is not dict:
            raise _bad("limits must be an object")
        for key, number in value.items():
            if type(number) is float and number.is_integer():
                number = int(number)  # an integral JSON number is an integer
            if type(number) is not int or not 1 <= number <= MAX_SAFE:
                raise _bad(f"limit {key!r} must be a positive safe integer")
            limits[key] = number
    return Discovery(service, endpoints, features, modes, peers, limits)


def build_discovery(
    origin: str,
    *,
    features: Iterable[str] = (),
    search_modes: Iterable[str] = (),
    peers: Iterable[str] = (),
    limits: Mapping[str, int] | None = None,
    extra: Mapping[str, JSON] | None = None,
    endpoints: Mapping[str, str] | None = None,
) -> JSONObject:
    """The discovery document of a service at ``origin``; validated before it is returned.

    Default endpoint paths are used unless ``endpoints`` overrides them; the
    search endpoint is listed only with the ``ranked-search`` feature.
    """
    names: list[JSON] = list(dict.fromkeys(features))
    doc: JSONObject = dict(extra or {})
    doc["protocol"] = PROTOCOL
    doc["service"] = origin
    ranked = RANKED_SEARCH in names
    urls: JSONObject = {name: origin + path for name, path in ENDPOINT_PATHS.items() if ranked or name != "search"}
    urls.update(endpoints or {})
    doc["endpoints"] = urls
    if names:
        doc["features"] = names
    if ranked:
        doc["search_modes"] = list[JSON](dict.fromkeys(search_modes))
    others: list[JSON] = [p for p in dict.fromkeys(peers) if p != origin]
    if others:
        doc["peers"] = others
    if limits:
        doc["limits"] = dict(limits)
    try:
        validate_discovery(doc, origin)
    except ProtocolError as exc:
        raise ValueError(f"cannot build a valid discovery document: {exc.message}") from None
    return doc
