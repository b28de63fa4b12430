"""The whole storage contract over every backend of :data:`backends.BACKENDS` (memory, SQLite, a real Redis).

Variants of one backend (SQLite's indexed and checkpointing stores, Redis with a text
index) subclass :class:`store_contract.StoreContract` in their own modules.
"""

from __future__ import annotations

import pytest

from backends import Opener, params
from store_contract import StoreContract


class TestStoreContract(StoreContract):
    @pytest.fixture(params=params(), autouse=True)
    def opener(self, request: pytest.FixtureRequest, tmp_path) -> Opener:  # noqa: ANN001
        opened = Opener(request.param, request, tmp_path)
        self.durable = opened.durable
        return opened

    @pytest.fixture
    def make_store(self, opener: Opener):
        return opener.log_stores(same=True)

    @pytest.fixture
    def new_store(self, opener: Opener):
        return opener.log_stores()
