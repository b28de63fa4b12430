"""Schema packages and the Space's Schema Environment (KIP §20).

Packages are installed by operator configuration only (§20.10, §88.8): this module
loads JSON artifacts from paths an operator names, never from event content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from akrelay.jsontypes import JSONArray, JSONObject
from akrelay.kip.errors import KipError
from akrelay.kip.space import AK_PACKAGE_REF as AK_PACKAGE_REF  # re-exported: the package this module loads

#: The artifact shipped with akrelay: ``schemas/`` of a source checkout, else the
#: identical copy installed as package data (a test keeps the two equal).
_ARTIFACT = "kip-akrelay-agent-knowledge-1.0.0.json"
_SOURCE_COPY = Path(__file__).resolve().parents[3] / "schemas" / _ARTIFACT
DEFAULT_PACKAGE_PATH = _SOURCE_COPY if _SOURCE_COPY.is_file() else Path(__file__).resolve().parents[1] / "data" / _ARTIFACT
CORE_REF = "kip://core@2.0.0"

#: Reserved Core names (§20.13) that a package must not shadow.
CORE_SYMBOLS = frozenset({"Concept", "Proposition", "Assertion", "Evidence", "Activity",
                          "evidence", "source", "generated_by", "inputs", "outputs", "associated_actors"})

KIND_LIST = {"ConceptType": "types", "Predicate": "predicates", "Facet": "facets",
             "StructuralField": "structural_fields"}


@dataclass(frozen=True, slots=True)
class SchemaPackage:
    ref: str
    path: str                      # package path, e.g. "akrelay/agent-knowledge"
    version: str
    description: str
    symbols: dict[str, JSONObject]  # local name -> definition (its "kind" one of KIND_LIST)
    digest: str                    # sha256 over the artifact bytes

    def exact(self, name: str) -> str:
        return f"kip://{self.path}@{self.version}/{name}"

    def lineage(self, name: str) -> str:
        return f"kip://{self.path}/{name}"


def load_package(path: str | Path) -> SchemaPackage:
    """Load and check one package artifact."""
    raw = Path(path).read_bytes()
    doc = json.loads(raw)
    ref = doc.get("ref", "")
    if not ref.startswith("kip://") or "@" not in ref:
        raise ValueError(f"{path}: package ref must be kip://<path>@<version>")
    pkg_path, version = ref[len("kip://"):].split("@", 1)
    symbols = doc.get("symbols")
    if not isinstance(symbols, dict) or not symbols:
        raise ValueError(f"{path}: package declares no symbols")
    for name, sym in symbols.items():
        if name in CORE_SYMBOLS:
            raise ValueError(f"{path}: symbol {name!r} shadows a reserved Core symbol")
        if sym.get("kind") not in KIND_LIST:
            raise ValueError(f"{path}: symbol {name!r} has unknown kind {sym.get('kind')!r}")
    return SchemaPackage(ref=ref, path=pkg_path, version=version, description=doc.get("description", ""),
                         symbols=symbols, digest="sha256:" + hashlib.sha256(raw).hexdigest())


@dataclass(slots=True)
class SchemaEnvironment:
    """The exact active package set of the one Space; version 1 is the configured set."""

    packages: list[SchemaPackage]
    version: int = 1
    _by_name: dict[str, list[tuple[SchemaPackage, JSONObject]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for pkg in self.packages:
            for name, sym in pkg.symbols.items():
                self._by_name.setdefault(name, []).append((pkg, sym))

    def resolve(self, name: str, kind: str | None = None) -> tuple[str, JSONObject]:
        """Local name or exact ref -> (exact ref, definition); fails rather than guesses (§20.7)."""
        if not isinstance(name, str) or not name:
            raise KipError("TypeMismatch", "a schema symbol must be a non-empty string")
        if name.startswith("kip://"):
            for pkg in self.packages:
                for local, sym in pkg.symbols.items():
                    if name in (pkg.exact(local), pkg.lineage(local)) and (kind is None or sym["kind"] == kind):
                        return pkg.exact(local), sym
            raise KipError("SchemaSymbolNotFound", f"no {kind or 'symbol'} {name!r} in the Schema Environment")
        matches = [(p, s) for p, s in self._by_name.get(name, []) if kind is None or s["kind"] == kind]
        if not matches:
            raise KipError("SchemaSymbolNotFound", f"no {kind or 'symbol'} named {name!r} in the Schema Environment",
                           details={"symbol": name})
        if len({p.path for p, _ in matches}) > 1:
            raise KipError("SchemaSymbolAmbiguous", f"{name!r} is exported by several packages",
                           details={"candidates": sorted(p.exact(name) for p, _ in matches)})
        pkg, sym = matches[0]
        return pkg.exact(name), sym

    def symbols_of(self, kind: str) -> list[tuple[str, str, JSONObject]]:
        """[(local name, exact ref, definition)] of one kind, sorted by name."""
        out = [(name, pkg.exact(name), sym) for pkg in self.packages for name, sym in pkg.symbols.items()
               if sym["kind"] == kind]
        return sorted(out, key=lambda t: (t[0], t[1]))

    def describe(self) -> JSONObject:
        packages: JSONArray = [{"ref": CORE_REF, "status": "active", "builtin": True}]
        packages.extend({"ref": p.ref, "status": "active", "integrity": {"content_digest": p.digest},
                         "installed_by": "operator_configuration"} for p in self.packages)
        return {
            "schema_environment_version": self.version,
            "packages": packages,
            "aliases": {name: self.resolve(name)[0] for pkg in self.packages for name in sorted(pkg.symbols)},
            "lineage_maps": [],
            "draft_vocabulary": None,
        }
