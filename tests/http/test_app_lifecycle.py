"""The app's shutdown order: background readers of other areas stop before the store closes."""

from __future__ import annotations


def test_the_search_indexer_stops_before_the_app_closes_its_store(tmp_path) -> None:
    """Else its next step reads a closed store and logs a traceback at every shutdown."""
    from litestar.testing import TestClient

    from akrelay.http.app import create_app
    from akrelay.http.search import search_service
    from akrelay.settings import defaults

    app = create_app(defaults(data=str(tmp_path / "data")))
    relay = app.state.relay
    with TestClient(app):
        service = search_service(relay)
        indexer = service._indexer
        assert indexer is not None and indexer.is_alive()
        closed_store: list[bool] = []
        close = relay.store.close

        def close_and_check() -> None:  # the indexer must already be stopped when the store closes
            closed_store.append(not indexer.is_alive() and service._closed.is_set())
            close()

        relay.store.close = close_and_check
    assert closed_store == [True]
