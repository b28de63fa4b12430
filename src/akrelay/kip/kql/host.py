"""What the KQL layer needs of the KIP runtime that hosts it, as a typed interface.

The runtime (``akrelay.kip.runtime.KipRuntime``) sits a layer above KQL, so KQL
names what it uses here instead of importing it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from akrelay.kip.nexus import NexusBase
from akrelay.kip.paging import CursorCodec


class KqlRuntime(Protocol):
    """What KQL evaluation needs of the KIP runtime (``akrelay.kip.runtime.KipRuntime``, a layer above).

    ``config`` (origin, trust, default policy) and ``environment`` (the installed
    Schema packages) are the runtime's operator configuration.
    """

    nexus: NexusBase
    cursors: CursorCodec
    now_ms: Callable[[], int]
    config: Any
    environment: Any
    #: held for a whole request: one request at a time per runtime, at one nexus snapshot
    lock: Any
