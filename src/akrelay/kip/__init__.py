"""akrelay as a KIP 2.0 gateway: the nexus, its import mapping, projection and META.

The in-process Python API (documented in ``docs/kip.md``) is re-exported here;
``akrelay.kip.kql`` (the KQL/META language front end) lives beside it.
"""

from __future__ import annotations

from akrelay.kip.config import KipConfig, TrustState, space_id_for_origin
from akrelay.kip.errors import KipError
from akrelay.kip.mapping import ImportResult, import_record
from akrelay.kip.nexus import Nexus, NexusBase
from akrelay.kip.projection import POLICIES, project

__all__ = [
    "ImportResult", "KipConfig", "KipError", "Nexus", "NexusBase", "POLICIES", "TrustState", "import_record", "project",
    "space_id_for_origin",
]
