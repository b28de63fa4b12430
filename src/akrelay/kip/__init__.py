"""akrelay as a KIP 2.0 gateway: the nexus, its import mapping, projection and META.

The in-process Python API (documented in ``docs/kip.md``) is re-exported here;
``akrelay.kip.kql`` (the KQL/META language front end) lives beside it.

The re-exports are loaded on first access (PEP 562): ``akrelay.kip.budget`` and
``akrelay.kip.options`` are read by the CLI and the settings, which must not pay
for the nexus and its dependencies (``akrelay --help``, the launcher; issue 25).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from akrelay.lazy import lazy_exports

if TYPE_CHECKING:
    from akrelay.kip.config import KipConfig, TrustState, space_id_for_origin
    from akrelay.kip.errors import KipError
    from akrelay.kip.mapping import ImportResult, import_record
    from akrelay.kip.nexus import Nexus, NexusBase
    from akrelay.kip.projection import POLICIES, project

#: Each re-exported name and the module that defines it.
_EXPORTS = {
    "KipConfig": "config", "TrustState": "config", "space_id_for_origin": "config", "KipError": "errors",
    "ImportResult": "mapping", "import_record": "mapping", "Nexus": "nexus", "NexusBase": "nexus",
    "POLICIES": "projection", "project": "projection",
}

__all__ = [
    "ImportResult", "KipConfig", "KipError", "Nexus", "NexusBase", "POLICIES", "TrustState", "import_record", "project",
    "space_id_for_origin",
]


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
