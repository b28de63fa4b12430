"""What the KIP core knows of its Space and operator: the Space id, trust classes, the import package.

Pure values (no files): :mod:`akrelay.kip.config` reads them from the operator's
files, and :mod:`akrelay.kip.package` loads the package this ref names.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

#: The schema package the import mapping writes with (``schemas/kip-akrelay-agent-knowledge-1.0.0.json``).
AK_PACKAGE_REF = "kip://akrelay/agent-knowledge@1.0.0"
TRUST_CLASSES = ("trusted", "unknown", "blocked")


def space_id_for_origin(origin: str) -> str:
    """The relay's one MemorySpace id, derived from its canonical origin only (§5.5)."""
    origin = origin.rstrip("/").lower()
    if not origin.startswith(("https://", "http://")):
        raise ValueError("the relay origin must be an http(s) origin")
    return "akrelay:" + origin.split("://", 1)[1]


@dataclass(frozen=True, slots=True)
class TrustState:
    """Operator trust classes per Agent ID; absent actors are ``unknown``."""

    classes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for actor, cls in self.classes.items():
            if cls not in TRUST_CLASSES:
                raise ValueError(f"trust class for {actor} must be one of {TRUST_CLASSES}, not {cls!r}")

    def of(self, actor: str) -> str:
        return self.classes.get(actor, "unknown")

    @property
    def version(self) -> str:
        """A content digest: any change of the trust state changes every basis (§21.12)."""
        canon = json.dumps(sorted(self.classes.items()), separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(canon).hexdigest()[:32]
