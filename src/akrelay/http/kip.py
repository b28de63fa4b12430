"""``POST /v1/kip``: the read-only KIP 2.0 runtime as a route provider.

Thin: parse the JSON body, hand it to :class:`akrelay.kip.runtime.KipRuntime`,
return its response envelope. Envelope-level failures are HTTP 400 with a
``status: "failed"`` envelope carrying the §86 error; operation failures are
HTTP 200 with each failed result carrying its own error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, post

from akrelay.kip.errors import KipError
from akrelay.kip.runtime import _kql_executor
from akrelay.kip.service import open_runtime

KIP_PATH = "/v1/kip"
JSON = "application/json"

#: Followers started by route providers, so embedding code and tests can stop them.
FOLLOWERS: list[Any] = []


class Gateway:
    """The relay's KIP runtime, opened on first use so that relays nobody asks about KIP
    pay nothing. Each request first catches up with the log (bounded to what was
    accepted since the last read); a background follower keeps it warm and persists."""

    def __init__(self, relay: Any, settings: Any) -> None:
        self.relay, self.settings = relay, settings
        self._runtime: Any = None
        self._follower: Any = None

    @property
    def space_id(self) -> str:
        from akrelay.kip.config import space_id_for_origin
        return space_id_for_origin(self.relay.config.origin)

    def runtime(self) -> Any:
        if self._runtime is None:
            store_path = getattr(self.relay.store, "path", None)
            data_dir = Path(store_path).parent if store_path is not None else None
            self._runtime, self._follower = open_runtime(self.relay.store, data_dir, origin=self.relay.config.origin)
            FOLLOWERS.append(self._follower)
        else:
            self._follower.catch_up()
        return self._runtime


def stop_followers() -> None:
    while FOLLOWERS:
        FOLLOWERS.pop().stop()


def routes(relay: Any, settings: Any) -> list[Any]:
    gateway = Gateway(relay, settings)

    @post(KIP_PATH, status_code=200)
    async def kip(request: Request) -> Response[bytes]:
        body = await request.body()
        runtime = gateway.runtime()
        media = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
        if media != JSON:
            status, envelope = 400, runtime._failed(None, KipError(
                "InvalidRequestEnvelope", "Content-Type must be application/json"))
        else:
            try:
                doc = json.loads(body, parse_constant=_reject_constant)
            except (ValueError, RecursionError):
                status, envelope = 400, runtime._failed(None, KipError(
                    "InvalidRequestEnvelope", "the body is not a JSON document"))
            else:
                status, envelope = runtime.execute(doc)
        return Response(content=msgspec.json.encode(envelope), status_code=status, media_type=JSON)

    return [kip]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def discovery(relay: Any, settings: Any) -> dict[str, Any]:
    """The extension member advertising the KIP endpoint (clients ignore unknown members)."""
    from akrelay.kip.package import AK_PACKAGE_REF
    from akrelay.kip.config import space_id_for_origin

    return {"kip": {
        "protocol": "KIP/2.0",
        "endpoint": relay.config.origin + KIP_PATH,
        "runtime": "readonly",
        "space_id": space_id_for_origin(relay.config.origin),
        "languages": ["META"] + (["KQL"] if _kql_executor() is not None else []),
        "capabilities": {"historical_reads": True, "historical_search": True},
        "schema_packages": [AK_PACKAGE_REF],
        "conformance_level": None,
    }}
