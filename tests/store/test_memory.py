"""The in-memory backend runs the whole storage contract."""

from __future__ import annotations

import pytest

from akrelay.store.memory import MemoryStore
from store_contract import StoreContract


class TestMemoryStore(StoreContract):
    durable = False

    @pytest.fixture
    def make_store(self):
        return MemoryStore

    @pytest.fixture
    def new_store(self):
        return MemoryStore
