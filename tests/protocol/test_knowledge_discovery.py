"""discovery_cases, and the documents we build pass our own client check."""

from __future__ import annotations

import pytest

from akrelay.protocol.discovery import build_discovery, canonical_origin, is_canonical_origin, validate_discovery
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.limits import Limits
from knowledge_vectors import SERVICE, cases

CASES = cases("discovery_cases")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_discovery_case(case):
    try:
        validate_discovery(case["document"], case.get("origin", SERVICE))
        outcome = "valid"
    except ProtocolError as exc:
        outcome = exc.code
    assert outcome == case["expected"]


@pytest.mark.parametrize("url,origin", [
    ("https://Knowledge.Example.com:443/v1/x?y#z", "https://knowledge.example.com"),
    ("https://example.com:8443", "https://example.com:8443"),
    ("https://[0:0:0:0:0:0:0:1]:443/", "https://[::1]"),
    ("https://bücher.example/", "https://xn--bcher-kva.example"),
    ("https://127.0.0.1/", "https://127.0.0.1"),
])
def test_canonical_origin(url, origin):
    assert canonical_origin(url) == origin
    assert is_canonical_origin(origin)


@pytest.mark.parametrize("value", ["http://example.com", "https://example.com/", "https://example.com:443",
                                   "https://EXAMPLE.com", "https://user@example.com", "https://example.com:99999"])
def test_not_canonical_origins(value):
    assert not is_canonical_origin(value)


def test_built_documents_validate():
    plain = build_discovery(SERVICE, limits=Limits().to_discovery(), peers=["https://peer.example", SERVICE])
    found = validate_discovery(plain, SERVICE)
    assert "search" not in plain["endpoints"] and "search_modes" not in plain
    assert found.peers == ("https://peer.example",) and found.limits["max_envelope_bytes"] == 262144
    assert found.endpoints["events"] == SERVICE + "/v1/knowledge/events"
    ranked = build_discovery(SERVICE, features=["ranked-search"], search_modes=["lexical"])
    found = validate_discovery(ranked, SERVICE)
    assert found.ranked_search and found.search_modes == ("lexical",)
    assert found.endpoints["search"] == SERVICE + "/v1/knowledge/search"


def test_build_refuses_an_invalid_document():
    with pytest.raises(ValueError):
        build_discovery(SERVICE, features=["ranked-search"], search_modes=["semantic"])
    with pytest.raises(ValueError):
        build_discovery("https://Example.com")
