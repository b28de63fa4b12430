"""The KIP cursor key (``akrelay.kip.wiring.cursor_secret``): derived from the store's secret, else random."""

from __future__ import annotations

import hashlib
import hmac

from akrelay.kip.wiring import CURSOR_SECRET_KEY, cursor_secret
from akrelay.store.capabilities import MetadataHolding
from akrelay.store.memory import MemoryStore


class _Secret:
    """A stand-in store with only the metadata area."""

    def __init__(self, value: bytes | None) -> None:
        self.value = value
        self.asked: list[str] = []

    def meta_get(self, key: str) -> bytes | None:
        self.asked.append(key)
        return self.value


def test_the_key_is_derived_from_the_stored_secret() -> None:
    store = _Secret(b"relay-secret")
    assert isinstance(store, MetadataHolding)
    key = cursor_secret(store)
    assert key == hmac.new(b"relay-secret", b"akrelay-kip", hashlib.sha256).digest()
    assert cursor_secret(store) == key  # every worker derives the same key
    assert store.asked == [CURSOR_SECRET_KEY, CURSOR_SECRET_KEY]


def test_without_a_stored_secret_the_key_is_random() -> None:
    for store in (_Secret(None), object()):
        first, second = cursor_secret(store), cursor_secret(store)
        assert len(first) == len(second) == 32 and first != second
    assert not isinstance(object(), MetadataHolding)


def test_a_store_has_the_metadata_area() -> None:
    store = MemoryStore()
    assert isinstance(store, MetadataHolding)
    store.meta_set(CURSOR_SECRET_KEY, b"s")
    assert cursor_secret(store) == hmac.new(b"s", b"akrelay-kip", hashlib.sha256).digest()
