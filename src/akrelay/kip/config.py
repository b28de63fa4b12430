"""Operator configuration of the gateway: Space origin, packages, trust classes, policy.

Everything here is protected control state (§20.8, §22.5): it comes from the
operator's files, never from event content or signatures (§2.11, §88.8).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from akrelay.kip.package import DEFAULT_PACKAGE_PATH
from akrelay.kip.space import TRUST_CLASSES, TrustState, space_id_for_origin

__all__ = ["CONFIG_FILE", "DEFAULT_POLICY", "TRUST_CLASSES", "KipConfig", "TrustState", "space_id_for_origin"]

DEFAULT_POLICY = "akrelay:corroborated"
#: The Space origin when neither the settings nor ``kip-config.json`` name one.
DEFAULT_ORIGIN = "http://127.0.0.1:8080"
CONFIG_FILE = "kip-config.json"


class KipConfigDocument(TypedDict, total=False):
    """``kip-config.json``: every member optional (a missing one takes its default)."""

    origin: str
    schema_packages: list[str]
    trust: dict[str, str]          # Agent ID -> trust class
    default_policy: str


@dataclass(frozen=True, slots=True)
class KipConfig:
    origin: str = DEFAULT_ORIGIN
    package_paths: tuple[str, ...] = (str(DEFAULT_PACKAGE_PATH),)
    trust: TrustState = field(default_factory=TrustState)
    default_policy: str = DEFAULT_POLICY

    @property
    def space_id(self) -> str:
        return space_id_for_origin(self.origin)

    @classmethod
    def from_dict(cls, doc: KipConfigDocument, *, origin: str | None = None) -> "KipConfig":
        allowed = {"origin", "schema_packages", "trust", "default_policy"}
        unknown = set(doc) - allowed
        if unknown:
            raise ValueError(f"unknown KIP configuration members: {sorted(unknown)}")
        return cls(
            origin=origin or doc.get("origin", DEFAULT_ORIGIN),
            package_paths=tuple(doc.get("schema_packages", (str(DEFAULT_PACKAGE_PATH),))),
            trust=TrustState(dict(doc.get("trust", {}))),
            default_policy=doc.get("default_policy", DEFAULT_POLICY),
        )

    @classmethod
    def load(cls, data_dir: str | os.PathLike[str] | None, *, origin: str | None = None) -> "KipConfig":
        """``<data>/kip-config.json`` if present, else defaults."""
        if data_dir is not None:
            path = Path(data_dir) / CONFIG_FILE
            if path.is_file():
                return cls.from_dict(json.loads(path.read_text(encoding="utf-8")), origin=origin)
        return cls(origin=origin) if origin else cls()
