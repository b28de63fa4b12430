"""The Merkle log and its signer as a component of the relay node (issue 23).

The log's routes are :mod:`akrelay.http.transparency`; discovery gains ``log``. Each
worker runs a one-second signer (:class:`~akrelay.relay.transparency.Ticker`), and the
store's compare-and-set keeps their checkpoints one consistent chain.

The key is ``--log-key FILE`` or, for an embedded store, ``log-key.pem`` made in
the data directory at first start. Nodes of a Redis deployment must share one
key file: without ``--log-key`` a Redis node serves no log (and says so once).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from akrelay.http import transparency as log_http
from akrelay.protocol.errors import ProtocolError
from akrelay.relay.transparency import KEY_NAME, Ticker, TransparencyLog, load_or_create_key
from akrelay.store.capabilities import MerkleSwitchable, blocking_io

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.federation.state import StateStore
    from akrelay.federation.witness import WitnessState
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings

log = logging.getLogger("akrelay.transparency")


def open_log(relay: Relay, settings: Settings, *, shared: bool = False) -> TransparencyLog | None:
    """The relay's transparency log, or ``None`` when it cannot have one (a Redis store without ``--log-key``).

    ``shared``: the node's backend is shared by several nodes (``akrelay.backend.Backend.shared``)."""
    if settings.no_merkle_log or (isinstance(relay.store, MerkleSwitchable) and not relay.store.merkle_log):
        return None  # measuring the log's cost: no tree, so nothing to sign
    key_file = settings.log_key
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

    def __init__(self, relay: Relay, settings: Settings, tlog: TransparencyLog | None, *,
                 federation_state: Callable[[], StateStore | None] | None = None,
                 witness_state: Callable[[], WitnessState] | None = None) -> None:
        """``tlog``: the log :meth:`open` loaded (``None``: this relay serves none). ``federation_state``,
        ``witness_state``: from the node's backend (the federation state that holds the peers' cosigned
        checkpoints; the records of what this relay cosigned as a witness). Reads and writes no file."""
        self.relay = relay
        self.settings = settings
        self.federation_state = federation_state
        self.witness_state = witness_state
        self.tlog = tlog
        self._ticker: Ticker | None = None

    @classmethod
    def open(cls, relay: Relay, settings: Settings, *, shared: bool = False,
             federation_state: Callable[[], StateStore | None] | None = None,
             witness_state: Callable[[], WitnessState] | None = None) -> LogComponent:
        """The component over the relay's log, its key read (or made, for an embedded store) here.

        Why not in the constructor: the key file is the node's state, like the store, so it is
        opened where the node opens the store (:meth:`akrelay.node.RelayNode.open`), and a
        component built by hand touches no file. ``shared``: the backend is shared by several
        nodes (one key file for a deployment)."""
        return cls(relay, settings, open_log(relay, settings, shared=shared),
                   federation_state=federation_state, witness_state=witness_state)

    def start(self) -> None:
        if self.tlog is not None and self._ticker is None:
            self._ticker = Ticker(self.tlog)
            self._ticker.start()

    def stop(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.stop()

    def discovery(self) -> dict[str, object]:
        return self.tlog.discovery(self.relay.config.origin) if self.tlog is not None else {}

    def routes(self) -> list[BaseRouteHandler]:
        if self.tlog is None:
            return []
        return log_http.routes(self.tlog, offload=blocking_io(self.relay.store),
                               cosigned=self.cosigned, add_checkpoint=self.add_checkpoint)

    def cosigned(self, name: str) -> str | None:
        """The cosigned checkpoint of the peer whose log origin is ``name`` (``None``: none)."""
        return cosigned_checkpoint(self.settings, name, self.federation_state, self.witness_state)

    def add_checkpoint(self, body: bytes) -> str:
        from akrelay.federation.peers import PeerConfigError, load_peers
        from akrelay.federation.witness import Witness, known_logs

        assert self.tlog is not None
        peers_file = self.settings.federation.peers
        try:
            verifiers = known_logs(load_peers(peers_file).peers) if peers_file else {}
        except PeerConfigError as exc:
            log.warning("add-checkpoint: the peer file cannot be read: %s", exc)
            verifiers = {}
        if not verifiers:  # nothing to witness: answered before the body's log is even looked at
            from akrelay.protocol.witness import parse_add_checkpoint

            origin = parse_add_checkpoint(body).checkpoint.origin
            raise ProtocolError("not_found", f"This witness does not know the log {origin!r}.")
        if self.witness_state is None:
            raise ProtocolError("not_found", "This relay keeps no witness records.")
        state = self.witness_state()
        try:
            return Witness(self.tlog.name, self.tlog.key, verifiers, state).add_checkpoint(body)
        finally:
            state.close()


def cosigned_checkpoint(settings: Settings, name: str,
                        federation_state: Callable[[], StateStore | None] | None,
                        witness_state: Callable[[], WitnessState] | None = None) -> str | None:
    """The cosigned checkpoint of the peer whose log origin is ``name``, from the federation state."""
    if not name or not settings.federation.peers or federation_state is None:
        return None
    state = federation_state()
    if state is None:
        return None
    witness = witness_state() if witness_state is not None else None
    record = None
    if witness is not None:
        try:
            record = witness.latest(name)
        finally:
            witness.close()
    try:
        if record is not None and not any(p.misbehaving and p.origin.removeprefix("https://") == name
                                          for p in state.all()):
            return str(record["note"])
        for peer in state.all():
            if peer.origin.removeprefix("https://") == name and peer.cosigned and not peer.misbehaving:
                return peer.cosigned
        return None
    finally:
        state.close()
