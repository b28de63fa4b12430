"""``RelayClient`` opens nothing and reads nothing until its first request (issue 25)."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import httpx
import pytest

import akrelay.client as client_module
from akrelay.client import RelayClient

ORIGIN = "https://relay.example"


def refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the constructor did I/O")


@pytest.fixture
def no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket, TLS context or HTTP client made while this fixture is active fails the test."""
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(ssl, "create_default_context", refuse)
    monkeypatch.setattr(httpx, "create_ssl_context", refuse)
    monkeypatch.setattr(client_module, "deadline_transport", refuse)
    monkeypatch.setattr(client_module.httpx, "Client", refuse)


def test_the_constructor_opens_no_connection_and_makes_no_tls_context(no_io: None, tmp_path: Path) -> None:
    for kwargs in ({}, {"cacert": str(tmp_path / "absent.pem")}, {"insecure": True}, {"discover": False}):
        client = RelayClient(ORIGIN, **kwargs)  # type: ignore[arg-type]
        assert client.origin == ORIGIN and client.discovery is None
        client.close()  # closing an unused client touches nothing either


def test_a_transport_is_first_used_by_the_first_request() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})

    with RelayClient(ORIGIN, transport=httpx.MockTransport(handler), discover=False) as client:
        assert seen == []
        with pytest.raises(client_module.ServiceError):
            client.get("a" * 64)
        assert seen == ["/v1/knowledge/events/" + "a" * 64]
    with pytest.raises(RuntimeError, match="closed"):
        client.get("a" * 64)


def test_a_bad_cacert_is_reported_by_the_first_request_with_the_same_message(tmp_path: Path) -> None:
    client = RelayClient(ORIGIN, cacert=str(tmp_path / "absent.pem"))
    with pytest.raises(ValueError, match=r"cannot read --cacert .*absent\.pem"):
        client.get("a" * 64)
    empty = tmp_path / "empty.pem"
    empty.write_text("not a certificate\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        RelayClient(ORIGIN, cacert=str(empty)).discover()
