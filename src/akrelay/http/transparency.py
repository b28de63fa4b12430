"""The Merkle log's endpoints and signer as a component of the relay node (issue 23).

``GET /v1/knowledge/checkpoint`` (C2SP signed note, ``text/plain``), ``/log``,
``/proof/inclusion`` and ``/proof/consistency`` (JSON); discovery gains ``log``.
Thin handlers over :class:`akrelay.service.transparency.TransparencyLog`; each
worker runs a one-second signer (:class:`~akrelay.service.transparency.Ticker`),
and the store's compare-and-set keeps their checkpoints one consistent chain.

The key is ``--log-key FILE`` or, for an embedded store, ``log-key.pem`` made in
the data directory at first start. Nodes of a Redis deployment must share one
key file: without ``--log-key`` a Redis node serves no log (and says so once).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import msgspec
from litestar import Request, get
from litestar.response.base import ASGIResponse

from akrelay.http.errors import JSON
from akrelay.protocol.errors import ProtocolError
from akrelay.service.transparency import KEY_NAME, WITNESS_PATH, Ticker, TransparencyLog, load_or_create_key

if TYPE_CHECKING:  # annotations only
    from akrelay.federation.state import StateStore
    from akrelay.service.relay import Relay
    from akrelay.settings import Settings

log = logging.getLogger("akrelay.transparency")
TEXT = "text/plain"  # Litestar appends "; charset=utf-8"


def open_log(relay: Relay, settings: Settings, *, shared: bool = False) -> TransparencyLog | None:
    """The relay's transparency log, or ``None`` when it cannot have one (a Redis store without ``--log-key``).

    ``shared``: the node's backend is shared by several nodes (``akrelay.backend.Backend.shared``)."""
    if getattr(settings, "no_merkle_log", False) or getattr(relay.store, "merkle_log", True) is False:
        return None  # measuring the log's cost: no tree, so nothing to sign
    key_file = getattr(settings, "log_key", None)
    if key_file:
        key = load_or_create_key(Path(key_file), create=False)
    elif shared or relay.data_dir is None:
        if shared:
            log.warning("no --log-key: nodes sharing a Redis store must sign with one key file; serving no Merkle log")
            return None
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()  # an in-memory relay (tests, tools): a key for this process only
    else:
        key = load_or_create_key(relay.data_dir / KEY_NAME, create=True)
    return TransparencyLog(relay.store, relay.config.origin, key, data_dir=relay.data_dir)


class LogComponent:
    """Checkpoints, entries and proofs of the acceptance log."""

    name = "log"
    options: tuple[str, ...] = ("log_key",)

    def __init__(self, relay: Relay, settings: Settings, *, shared: bool = False,
                 federation_state: Callable[[], StateStore | None] | None = None) -> None:
        """``shared``, ``federation_state``: from the node's backend (one log key for a deployment; the
        federation state that holds the peers' cosigned checkpoints)."""
        self.relay = relay
        self.settings = settings
        self.federation_state = federation_state
        self.tlog = open_log(relay, settings, shared=shared)
        self._ticker: Ticker | None = None

    def start(self) -> None:
        if self.tlog is not None and self._ticker is None:
            self._ticker = Ticker(self.tlog)
            self._ticker.start()

    def stop(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.stop()

    def discovery(self) -> dict[str, Any]:
        return self.tlog.discovery(self.relay.config.origin) if self.tlog is not None else {}

    def routes(self) -> list[Any]:
        tlog = self.tlog
        if tlog is None:
            return []
        offload = bool(getattr(self.relay.store, "blocking_io", False))

        def params(request: Request) -> dict[str, str]:
            from akrelay.http.querystring import query_pairs

            return dict(query_pairs(request.scope["query_string"]))

        def answer(body: dict[str, Any]) -> ASGIResponse:
            return ASGIResponse(body=msgspec.json.encode(body), status_code=200, media_type=JSON)

        @get("/v1/knowledge/checkpoint", sync_to_thread=offload)
        def checkpoint() -> ASGIResponse:
            return ASGIResponse(body=tlog.checkpoint_text().encode(), status_code=200, media_type=TEXT,
                                headers={"cache-control": "no-cache"})

        @get("/v1/knowledge/log", sync_to_thread=offload)
        def entries(request: Request) -> ASGIResponse:
            return answer(tlog.entries(params(request)))

        @get("/v1/knowledge/proof/inclusion", sync_to_thread=offload)
        def inclusion(request: Request) -> ASGIResponse:
            return answer(tlog.inclusion(params(request)))

        @get("/v1/knowledge/proof/consistency", sync_to_thread=offload)
        def consistency(request: Request) -> ASGIResponse:
            return answer(tlog.consistency(params(request)))

        settings = self.settings

        @get(WITNESS_PATH, sync_to_thread=True)
        def witnessed(request: Request) -> ASGIResponse:
            """A peer's last checkpoint we verified, with our cosignature (``?origin=<its log origin>``)."""
            wanted = params(request).get("origin", "")
            text = cosigned_checkpoint(settings, wanted, self.federation_state)
            if text is None:
                raise ProtocolError("not_found", f"This relay has cosigned no checkpoint of {wanted!r}.")
            return ASGIResponse(body=text.encode(), status_code=200, media_type=TEXT)

        return [checkpoint, entries, inclusion, consistency, witnessed]


def cosigned_checkpoint(settings: Settings, name: str,
                        federation_state: Callable[[], StateStore | None] | None) -> str | None:
    """The cosigned checkpoint of the peer whose log origin is ``name``, from the federation state."""
    if not name or not getattr(settings, "peers", "") or federation_state is None:
        return None
    state = federation_state()
    if state is None:
        return None
    try:
        for peer in state.all():
            if peer.origin.removeprefix("https://") == name and peer.cosigned and not peer.misbehaving:
                return peer.cosigned
        return None
    finally:
        state.close()
