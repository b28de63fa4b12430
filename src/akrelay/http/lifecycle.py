"""Requests use services, never start them: what a component answers outside ``start()``..``stop()``.

A component opens its services in ``start()`` and closes them in ``stop()``. A request
that arrives before the node started or after it stopped (a worker shutting down while
connections drain) gets a 503 with ``Retry-After`` instead of a service opened for it
that nothing would ever close.
"""

from __future__ import annotations

from akrelay.store.base import StoreUnavailable


class NotRunning(StoreUnavailable):
    """The component's service is not running now: 503 ``service_unavailable``, not a bug."""

    def __init__(self, what: str) -> None:
        super().__init__(f"The {what} is not running on this node (it is starting or stopping); retry shortly.", 1)
