"""Each backend offers exactly the optional capabilities it documents (``akrelay.store.capabilities``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from backends import Opener, params

from akrelay.store.capabilities import (
    BlockingIO, FileBacked, LogFollowing, MemoryReporting, MerkleSwitchable, Reconcilable, TextIndexed, Watchable,
    blocking_io, store_directory,
)

EVERY = (Watchable, BlockingIO, FileBacked, MemoryReporting, TextIndexed, LogFollowing, Reconcilable, MerkleSwitchable)
#: What each backend can do beyond the Store protocol.
EXPECTED = {
    "memory": {Reconcilable},
    "sqlite": {FileBacked, TextIndexed, Reconcilable, MerkleSwitchable},
    "redis": {Watchable, BlockingIO, MemoryReporting, TextIndexed, LogFollowing, Reconcilable},
}


@pytest.mark.parametrize("backend", params())
def test_capabilities_of_each_backend(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    store = Opener(backend, request, tmp_path).log_store()
    try:
        assert {cap for cap in EVERY if isinstance(store, cap)} == EXPECTED[backend]
        assert blocking_io(store) is (backend == "redis")
        assert store_directory(store) == (tmp_path if backend == "sqlite" else None)
    finally:
        store.close()


def test_an_object_without_the_members_has_no_capability() -> None:
    assert not any(isinstance(object(), cap) for cap in EVERY)
    assert blocking_io(object()) is False and store_directory(object()) is None
