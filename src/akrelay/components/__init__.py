"""The relay node's components, one module each (:data:`akrelay.node.REGISTRY` builds them).

A component owns one area's running parts: what :meth:`start` opens and :meth:`stop` closes,
its discovery members, and the routes it mounts, which come from the thin handlers in
:mod:`akrelay.http`. ``log`` (the Merkle log and its signer), ``search`` (the index and its
indexer), ``kip`` (the KIP runtime and its importer), ``sync`` (the push stream, reconciliation
and the sync loop) and ``knowql`` (the turn service). The web component (explorer, metrics,
OpenAPI) lives with the process modules.
"""
