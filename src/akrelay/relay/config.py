"""Service configuration: one frozen value per running relay.

Kept separate from the HTTP settings (ports, TLS, workers) because the same
acceptance and read rules must apply to HTTP, to peers and to the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from akrelay.protocol.limits import Limits
from akrelay.protocol.options import ValidationOptions


@dataclass(frozen=True, slots=True)
class RelayConfig:
    #: The public origin: the ``service`` member of every response and of discovery.
    origin: str = "https://localhost:8443"
    #: Service limits (local admission policy, §9.7). ``max_envelope_bytes`` below wins for size.
    limits: Limits = field(default_factory=Limits)
    options: ValidationOptions = field(default_factory=ValidationOptions)
    #: Future skew allowance of §8.1 step 4 (the Identity live-write window).
    skew_ms: int = 300_000
    #: Licence URLs this relay accepts, or ``None`` to accept any licence.
    licence_allowlist: frozenset[str] | None = None
    #: Size limit on the submitted bytes, checked before parsing. (Query ``limit``
    #: defaults and the batch bound are fixed by §9.3/§9.4: 100, 1..1000, 1..100.)
    max_envelope_bytes: int = 262_144
    #: Peer origins advertised in discovery (hints only, §9.2).
    peers: tuple[str, ...] = ()
    #: Discovery features; ``ranked-search`` only once search is wired in.
    features: tuple[str, ...] = ()
    search_modes: tuple[str, ...] = ()
    #: Endpoint paths relative to the origin (§9.1 defaults).
    events_path: str = "/v1/knowledge/events"
    query_path: str = "/v1/knowledge/query"
    batch_path: str = "/v1/knowledge/batch"
    search_path: str = "/v1/knowledge/search"

    def __post_init__(self) -> None:
        for name in ("skew_ms", "max_envelope_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < (0 if name == "skew_ms" else 1):
                raise ValueError(f"{name} must be a positive integer")
        if self.licence_allowlist is not None and not isinstance(self.licence_allowlist, frozenset):
            object.__setattr__(self, "licence_allowlist", frozenset(self.licence_allowlist))
        object.__setattr__(self, "origin", self.origin.rstrip("/"))
        object.__setattr__(self, "peers", tuple(self.peers))
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "search_modes", tuple(self.search_modes))
