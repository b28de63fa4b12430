"""The one trigram indexer (store/text_indexer.py), over each store's own target.

Built without starting anything (the owner starts background work in ``start()``),
it catches the index up once started, and stops cleanly.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from akrelay.store.redis.store import RedisStore
from akrelay.store.redis.text import TEXT_INDEX_FILE
from akrelay.store.sqlite import SqliteStore
from akrelay.store.text_indexer import TextIndexer
from store_contract import corpus


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def _wait(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        made: Any = SqliteStore(tmp_path / "relay.sqlite3", text_indexer=False, indexer_interval=0.02)
    else:
        made = RedisStore(request.getfixturevalue("redis_url"), text_index=tmp_path / TEXT_INDEX_FILE,
                          text_indexer=False)
    yield made
    made.close()


def test_the_indexer_is_built_idle_then_catches_up_and_stops(store: Any) -> None:
    envs = corpus()
    store.commit_many([(e, 1) for e in envs])
    indexer = store.text_indexer()
    assert isinstance(indexer, TextIndexer)
    assert not indexer.is_alive() and not _threads(indexer.thread_name)  # building starts no thread
    assert store.text_index_lag() == len(envs)
    indexer.start()
    try:
        assert _wait(lambda: store.text_index_lag() == 0)
        assert _wait(lambda: indexer.position() == store.checkpoint())
    finally:
        indexer.stop()
    assert not indexer.is_alive() and not _threads(indexer.thread_name)
