"""``akrelay_text_index_lag``: records in the log that the node's ``q`` trigram index has not taken yet.

On both stores the gauge follows the index: it counts what was committed past its
position, and falls to zero once the index has caught up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from akrelay.observability.routes import scrape
from akrelay.protocol.signer import Signer, publish_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.settings import defaults
from akrelay.store.redis.store import RedisStore
from akrelay.store.redis.text import TEXT_INDEX_FILE
from akrelay.store.sqlite import SqliteStore
from store_contract import BASE_TIME, LICENSE, envelope_from_signed
from tests.observability.test_metrics import value

ORIGIN = "https://relay.test"


def _envelopes(n: int) -> list[Any]:
    signer = Signer.from_seed(b"\x07" * 32)
    return [envelope_from_signed(signer.sign(publish_event(signer.agent_id, BASE_TIME + i, i + 1, {
        "license": LICENSE, "kind": "observation", "title": f"lag {i}", "statement": f"the index trails {i}",
        "language": "en", "basis": "b", "context": {"scope": "s", "conditions": [], "limitations": []},
    }))) for i in range(n)]


def _store(kind: str, tmp_path: Path, redis_url: str | None) -> Any:
    if kind == "sqlite":
        return SqliteStore(tmp_path / "relay.sqlite3")
    assert redis_url is not None
    return RedisStore(redis_url, text_index=tmp_path / TEXT_INDEX_FILE, text_indexer=False)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_the_gauge_counts_records_the_text_index_has_not_taken(kind, tmp_path, request) -> None:
    redis_url = request.getfixturevalue("redis_url") if kind == "redis" else None
    store = _store(kind, tmp_path, redis_url)
    relay = Relay(store, RelayConfig(origin=ORIGIN), cursor_secret=b"k" * 32)
    settings = defaults(store=redis_url or "")
    try:
        store.commit_many([(env, BASE_TIME + i) for i, env in enumerate(_envelopes(5))])
        text = scrape(relay, settings)[0].decode()
        assert value(text, "akrelay_checkpoint") == 5
        assert value(text, "akrelay_text_index_lag") == 5
        assert store.index_text(3) == 3
        assert value(scrape(relay, settings)[0].decode(), "akrelay_text_index_lag") == 2
        while store.index_text(100):
            pass
        text = scrape(relay, settings)[0].decode()
        assert "akrelay_text_index_lag 0.0" in text  # present (not merely absent, which also reads as 0)
    finally:
        relay.close()


def test_an_unusable_redis_text_index_shows_the_whole_log_as_lag(redis_url, tmp_path) -> None:
    """A node whose file is gone (being rebuilt) scans every ``q`` in Redis: the gauge says so."""
    store = RedisStore(redis_url, text_index=tmp_path / TEXT_INDEX_FILE, text_indexer=False)
    relay = Relay(store, RelayConfig(origin=ORIGIN), cursor_secret=b"k" * 32)
    settings = defaults(store=redis_url)
    try:
        store.commit_many([(env, BASE_TIME + i) for i, env in enumerate(_envelopes(4))])
        while store.index_text(100):
            pass
        assert "akrelay_text_index_lag 0.0" in scrape(relay, settings)[0].decode()
        for path in tmp_path.glob(TEXT_INDEX_FILE + "*"):
            if not path.name.endswith(".lock"):
                path.unlink()
        assert value(scrape(relay, settings)[0].decode(), "akrelay_text_index_lag") == 4
    finally:
        relay.close()
