"""Operator configuration of the gateway: Space origin, packages, trust classes, policy.

Everything here is protected control state (§20.8, §22.5): it comes from the
operator's files, never from event content or signatures (§2.11, §88.8).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from akrelay.kip.package import DEFAULT_PACKAGE_PATH

TRUST_CLASSES = ("trusted", "unknown", "blocked")
DEFAULT_POLICY = "akrelay:corroborated"
CONFIG_FILE = "kip-config.json"


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


@dataclass(frozen=True, slots=True)
class KipConfig:
    origin: str = "http://127.0.0.1:8080"
    package_paths: tuple[str, ...] = (str(DEFAULT_PACKAGE_PATH),)
    trust: TrustState = field(default_factory=TrustState)
    default_policy: str = DEFAULT_POLICY

    @property
    def space_id(self) -> str:
        return space_id_for_origin(self.origin)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, origin: str | None = None) -> "KipConfig":
        allowed = {"origin", "schema_packages", "trust", "default_policy"}
        unknown = set(doc) - allowed
        if unknown:
            raise ValueError(f"unknown KIP configuration members: {sorted(unknown)}")
        return cls(
            origin=origin or doc.get("origin", cls.origin),
            package_paths=tuple(doc.get("schema_packages", (str(DEFAULT_PACKAGE_PATH),))),
            trust=TrustState(dict(doc.get("trust", {}))),
            default_policy=doc.get("default_policy", DEFAULT_POLICY),
        )

    @classmethod
    def load(cls, data_dir: str | Path | None, *, origin: str | None = None) -> "KipConfig":
        """``<data>/kip-config.json`` if present, else defaults."""
        if data_dir is not None:
            path = Path(data_dir) / CONFIG_FILE
            if path.is_file():
                return cls.from_dict(json.loads(path.read_text(encoding="utf-8")), origin=origin)
        return cls(origin=origin) if origin else cls()
