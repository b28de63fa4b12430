"""Both nexus backends for the KIP and KQL suites (imported by their conftest files).

``new_nexus(space_id)`` returns a nexus of the backend the running test was
parametrized with (the autouse ``nexus_backend`` fixture of ``tests/kip`` and
``tests/kql``): the in-memory one, or an SQLite file in a temporary directory
opened as importer (the same object then serves the test's reads, each read in
its own snapshot). Every suite test runs against both.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from akrelay.kip.nexus import Nexus, NexusBase
from akrelay.kip.nexus_sqlite import NEXUS_FILE, SqliteNexus

BACKENDS = ("memory", "sqlite")
_state: dict[str, Any] = {"backend": "memory", "dir": None, "opened": []}


def new_nexus(space_id: str) -> NexusBase:
    if _state["backend"] == "memory":
        return Nexus(space_id)
    path = Path(tempfile.mkdtemp(dir=_state["dir"])) / NEXUS_FILE
    nexus = SqliteNexus(path, space_id, writer=True)
    _state["opened"].append(nexus)
    return nexus


@pytest.fixture(autouse=True, params=BACKENDS)
def nexus_backend(request: Any, tmp_path_factory: Any) -> Iterator[str]:
    _state.update(backend=request.param, dir=tmp_path_factory.mktemp("nexus"), opened=[])
    try:
        yield request.param
    finally:
        for nexus in _state["opened"]:
            nexus.close()
        _state.update(backend="memory", dir=None, opened=[])
